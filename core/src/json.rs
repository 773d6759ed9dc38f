//! JSON from servers and the slot protocol, nested as deep as Conductor allows. serde_json
//! stops at 128 levels, but Conductor accepts task input nested up to 1,000 levels: one such
//! task must not make a whole batch (or a result update's answer) undecodable. Depth is
//! measured first, iteratively, so nothing deeper than [`MAX_DEPTH`] is ever parsed
//! recursively.

use serde::de::Deserialize as _;
use serde_json::Value;
use std::borrow::Cow;

/// The deepest nesting accepted: Conductor's own limit (Jackson's default `maxNestingDepth`).
pub const MAX_DEPTH: usize = 1000;

/// JSON that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("JSON nested {depth} levels deep; at most {MAX_DEPTH} are accepted")]
    TooDeep {
        /// The depth found (it stops counting a little past the limit).
        depth: usize,
    },
    /// Not JSON.
    #[error("{0}")]
    Syntax(String),
}

/// The deepest array/object nesting of `text`, counted without recursion (brackets inside
/// strings are skipped). Stops counting at `limit + 1`.
pub fn nesting_depth(text: &str, limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        i += 1;
        if in_string {
            if escaped {
                escaped = false;
                continue;
            }
            match b {
                b'\\' => escaped = true,
                b'"' => in_string = false,
                // Inside a string only a quote or a backslash matters: jump to the next one
                // (a long string is crossed at memchr's speed, not a byte at a time).
                _ => match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return deepest,
                },
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    return deepest;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parses `text` as one JSON value nested at most [`MAX_DEPTH`] levels.
pub fn from_str(text: &str) -> Result<Value, JsonError> {
    let depth = nesting_depth(text, MAX_DEPTH);
    if depth > MAX_DEPTH {
        return Err(JsonError::TooDeep { depth });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    if depth > 100 {
        // Within MAX_DEPTH (checked above): deep enough for serde_json's default limit, and
        // parsed on a stack that grows as needed.
        de.disable_recursion_limit();
        let value = Value::deserialize(serde_stacker::Deserializer::new(&mut de))
            .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
        de.end()
            .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
        return Ok(value);
    }
    let value =
        Value::deserialize(&mut de).map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
    de.end()
        .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
    Ok(value)
}

/// Checks that `text` is one JSON value that [`from_str`] would take (the same depth limit,
/// the same syntax and number rules, the same error texts), without building it: nothing is
/// allocated per string, number or container.
pub fn check(text: &str) -> Result<(), JsonError> {
    let depth = nesting_depth(text, MAX_DEPTH);
    if depth > MAX_DEPTH {
        return Err(JsonError::TooDeep { depth });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let checked = if depth > 100 {
        de.disable_recursion_limit();
        Checked::deserialize(serde_stacker::Deserializer::new(&mut de))
    } else {
        Checked::deserialize(&mut de)
    };
    checked.map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
    de.end()
        .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))
}

/// Accepts exactly what `serde_json::Value` accepts (numbers are parsed, so one out of
/// range fails as it does there), keeping nothing.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_none<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// JSON text checked once (as [`from_str`] would take it) and kept as text, so that it can be
/// forwarded — to a body, over the slot protocol, to Conductor — without being parsed into a
/// `Value` and written again. Surrounding whitespace is not kept.
#[derive(Clone, PartialEq, Eq)]
pub struct RawJson(String);

impl RawJson {
    /// Checks `text` with [`check`] and keeps it (without a copy when it has no surrounding
    /// whitespace).
    pub fn parse(text: String) -> Result<Self, JsonError> {
        // Checked as given, so that an error's position is the one parsing gives.
        check(&text)?;
        let trimmed = text.trim_matches(is_json_whitespace);
        if trimmed.len() == text.len() {
            return Ok(Self(text));
        }
        Ok(Self(trimmed.to_owned()))
    }

    /// `text` checked for depth and syntax the way serde_json skips a value (without
    /// parsing it: numbers are not range-checked), for text that went through [`check`]
    /// before, in another process.
    pub fn skimmed(text: String) -> Result<Self, JsonError> {
        let depth = nesting_depth(&text, MAX_DEPTH);
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep { depth });
        }
        let raw = serde_json::from_str::<&serde_json::value::RawValue>(&text)
            .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?;
        if raw.get().len() != text.len() {
            return Ok(Self(raw.get().to_owned()));
        }
        Ok(Self(text))
    }

    /// `text` taken as it is: JSON that was checked before, or written by serde_json, by this
    /// process. Nothing is checked here.
    pub fn trusted(text: String) -> Self {
        Self(text)
    }

    /// The compact JSON text of `value`.
    pub fn from_value(value: &impl serde::Serialize) -> Self {
        // A `Value`, a map or a derived type always serializes to JSON.
        Self(serde_json::to_string(value).expect("serializes to JSON"))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, as a `String`.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The length of the text in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty (never, for checked JSON).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parsed into a `Value` (for the few places that read into it).
    pub fn to_value(&self) -> Result<Value, JsonError> {
        from_str(&self.0)
    }

    /// Whether the value is a JSON object.
    pub fn is_object(&self) -> bool {
        kind(&self.0) == Kind::Object
    }
}

impl std::fmt::Debug for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// JSON's whitespace (RFC 8259): the only bytes allowed around a value.
fn is_json_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// The type of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl Kind {
    /// As a message names it: "null", "a boolean", "an object", …
    pub fn described(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::String => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }
}

/// The type of the JSON value `text` (valid JSON, checked before), read from its first byte.
pub fn kind(text: &str) -> Kind {
    match text
        .trim_start_matches(is_json_whitespace)
        .as_bytes()
        .first()
    {
        Some(b'{') => Kind::Object,
        Some(b'[') => Kind::Array,
        Some(b'"') => Kind::String,
        Some(b't' | b'f') => Kind::Bool,
        Some(b'n') | None => Kind::Null,
        Some(_) => Kind::Number,
    }
}

/// Splits the JSON object `text` into its members, each value kept as its text (a slice of
/// `text`): only the top level is read, by a scan that crosses strings at memchr's speed and
/// parses nothing but the keys (checked as parsing checks them). A key given twice keeps its
/// last value, as a parsed `Map` does. A key is borrowed from `text` unless it has escapes.
/// The values are not checked: `text` is valid JSON when it was checked before ([`check`],
/// [`RawJson::skimmed`]), or when this succeeds and every value checks. An error here says
/// only that the text is broken: [`check`] says how.
pub fn members(text: &str) -> Result<Vec<(Cow<'_, str>, &str)>, JsonError> {
    let broken = |what: &str| JsonError::Syntax(format!("{what} (not a checked JSON object)"));
    let bytes = text.as_bytes();
    let skip_space = |mut i: usize| {
        while bytes
            .get(i)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            i += 1;
        }
        i
    };
    // Where the string opening at `i` ends (after its closing quote).
    let string_end = |mut i: usize| -> Result<usize, JsonError> {
        i += 1;
        loop {
            match memchr::memchr2(b'"', b'\\', &bytes[i.min(bytes.len())..]) {
                Some(at) if bytes[i + at] == b'"' => return Ok(i + at + 1),
                Some(at) => i += at + 2,
                None => return Err(broken("a string does not end")),
            }
        }
    };
    let mut i = skip_space(0);
    if bytes.get(i) != Some(&b'{') {
        return Err(broken("expected an object"));
    }
    i = skip_space(i + 1);
    let mut members: Vec<(Cow<'_, str>, &str)> = Vec::new();
    // Keys seen, as bits of a 256-bit filter: a key given twice is rare, and only a key whose
    // bit is set is looked for among the earlier ones (a task has some 50 keys; hashing each
    // into a map cost more than the rest of the scan).
    let mut seen = [0u64; 4];
    if bytes.get(i) == Some(&b'}') {
        return Ok(members);
    }
    loop {
        if bytes.get(i) != Some(&b'"') {
            return Err(broken("expected a key"));
        }
        let key_end = string_end(i)?;
        let raw_key = &text[i + 1..key_end - 1];
        let key = if raw_key.bytes().any(|b| b == b'\\' || b < 0x20) {
            Cow::Owned(
                serde_json::from_str::<String>(&text[i..key_end])
                    .map_err(|e| JsonError::Syntax(crate::errors::chain(&e)))?,
            )
        } else {
            Cow::Borrowed(raw_key)
        };
        i = skip_space(key_end);
        if bytes.get(i) != Some(&b':') {
            return Err(broken("expected a colon"));
        }
        i = skip_space(i + 1);
        let start = i;
        let mut depth = 0usize;
        loop {
            match bytes.get(i) {
                None => return Err(broken("a value does not end")),
                Some(b'"') => {
                    i = string_end(i)?;
                    continue;
                }
                Some(b'[' | b'{') => depth += 1,
                Some(b']' | b'}') if depth == 0 => break,
                Some(b']' | b'}') => depth -= 1,
                Some(b',') if depth == 0 => break,
                Some(_) => {}
            }
            i += 1;
        }
        let value = text[start..i].trim_end_matches(is_json_whitespace);
        // FNV-1a of the key, to one of 256 bits.
        let bit = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }) >> 56;
        let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
        let earlier = if seen[word] & mask == 0 {
            seen[word] |= mask;
            None
        } else {
            members.iter().position(|(k, _)| *k == key)
        };
        match earlier {
            Some(at) => members[at].1 = value,
            None => members.push((key, value)),
        }
        match bytes[i] {
            b',' => i = skip_space(i + 1),
            b'}' if skip_space(i + 1) == bytes.len() => return Ok(members),
            _ => return Err(broken("the object does not end where it should")),
        }
    }
}

/// Writes `text` into `out` as a JSON string.
pub fn push_string(out: &mut String, text: &str) {
    // Writing a string into a `String` cannot fail, and serde_json writes valid UTF-8.
    let mut bytes = std::mem::take(out).into_bytes();
    serde_json::to_writer(&mut bytes, text).expect("a string serializes");
    *out = String::from_utf8(bytes).expect("serde_json writes UTF-8");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!(
            "{{\"params\": {}1{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    }

    /// The byte-at-a-time count the string skipping must agree with.
    fn reference_depth(text: &str) -> usize {
        let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
        for b in text.bytes() {
            if in_string {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    #[test]
    fn skipping_strings_counts_as_the_byte_at_a_time_scan() {
        let long = "x".repeat(100_000);
        for text in [
            r#"{"a": "\\", "b": [[1]]}"#.to_owned(),
            r#"{"a": "\\\"[[[", "b": [2]}"#.to_owned(),
            r#"["\"", ["\\"], [["]]]"]]]"#.to_owned(),
            format!(r#"{{"pad": "{long}[[[", "n": [[[[1]]]]}}"#),
            format!(r#"{{"pad": "{long}\"{long}", "n": [[1]]}}"#),
            r#"{"open": "never closed [[[["#.to_owned(),
            r#"{"trailing": "\"#.to_owned(),
            "[[[[[[".to_owned(),
            String::new(),
        ] {
            assert_eq!(
                nesting_depth(&text, MAX_DEPTH),
                reference_depth(&text),
                "{}",
                &text[..text.len().min(80)]
            );
        }
    }

    #[test]
    fn depth_is_counted_outside_strings() {
        assert_eq!(
            nesting_depth(r#"{"a": "[[[[", "b": [1, {"c": "\"]"}]}"#, 10),
            3
        );
        assert_eq!(nesting_depth("1", 10), 0);
        assert_eq!(
            nesting_depth(&"[".repeat(50), 10),
            11,
            "stops past the limit"
        );
    }

    /// Conductor's limit, parsed, serialized and dropped on a 2 MiB thread (tokio's worker
    /// stack) in whatever profile the tests run.
    #[test]
    fn conductors_deepest_input_round_trips_on_a_small_stack() {
        let text = nested(MAX_DEPTH);
        let handle = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let value = from_str(&text).unwrap();
                let again = serde_json::to_string(&value).unwrap();
                assert_eq!(nesting_depth(&again, usize::MAX), MAX_DEPTH);
                drop(value);
            })
            .unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn deeper_than_conductor_is_refused_without_parsing() {
        let text = nested(100_000);
        assert_eq!(
            from_str(&text).unwrap_err().to_string(),
            "JSON nested 1001 levels deep; at most 1000 are accepted"
        );
        assert!(matches!(from_str("[1,"), Err(JsonError::Syntax(_))));
        assert!(matches!(from_str("[1] x"), Err(JsonError::Syntax(_))));
    }

    /// Texts `check` must answer exactly as parsing into a `Value` does.
    fn corpus() -> Vec<String> {
        vec![
            r#"{"a": [1, 2.5, -3e2, true, null, "x\u00e9\n"], "b": {}}"#.to_owned(),
            r#"{"a": 1, "a": 2}"#.to_owned(),
            "  [1, 2]\n".to_owned(),
            "1e400".to_owned(),
            r#"{"n": -1e400}"#.to_owned(),
            r#"["\ud800"]"#.to_owned(),
            r#"["\udc00x"]"#.to_owned(),
            "[\"a\u{1}\"]".to_owned(),
            r#"["\q"]"#.to_owned(),
            "[1,".to_owned(),
            "[1] x".to_owned(),
            "[1,]".to_owned(),
            r#"{"a" 1}"#.to_owned(),
            "{1: 2}".to_owned(),
            "01".to_owned(),
            "1.".to_owned(),
            "tru".to_owned(),
            String::new(),
            "  ".to_owned(),
            nested(101),
            nested(1000),
            nested(1001),
            format!("{}]", nested(500)),
        ]
    }

    #[test]
    fn check_answers_as_parsing_does() {
        for text in corpus() {
            assert_eq!(
                check(&text),
                from_str(&text).map(drop),
                "{}",
                &text[..text.len().min(60)]
            );
        }
    }

    #[test]
    fn raw_json_keeps_the_text_it_was_given() {
        let text = r#"{"x": 1.0e2, "s": "\u00e9", "big": 123456789012345678901234567890, "z": 0, "a": []}"#;
        let raw = RawJson::parse(text.to_owned()).unwrap();
        assert_eq!(
            raw.as_str(),
            text,
            "byte for byte: no number or escape rewritten"
        );
        assert!(raw.is_object());
        // Surrounding whitespace is not kept; inner whitespace is.
        let raw = RawJson::parse(format!(" \n{text}\r\n ")).unwrap();
        assert_eq!(raw.as_str(), text);
        assert_eq!(raw.to_value().unwrap()["x"], 100.0);
        assert!(!RawJson::parse("[1]".to_owned()).unwrap().is_object());
        // Refused with the errors parsing gives.
        for text in corpus() {
            if let Err(e) = from_str(&text) {
                assert_eq!(RawJson::parse(text.clone()).unwrap_err(), e);
            }
        }
    }

    #[test]
    fn skimming_refuses_depth_and_syntax_as_parsing_does() {
        let text = r#" {"x": 1.0e2, "s": "\u00e9"} "#;
        assert_eq!(
            RawJson::skimmed(text.to_owned()).unwrap().as_str(),
            text.trim()
        );
        for text in [
            nested(1001),
            "[1,".to_owned(),
            "[1] x".to_owned(),
            "{".to_owned(),
        ] {
            assert_eq!(
                RawJson::skimmed(text.clone()).unwrap_err(),
                from_str(&text).unwrap_err(),
                "{}",
                &text[..text.len().min(60)]
            );
        }
    }

    #[test]
    fn members_are_slices_of_the_text_and_the_last_of_a_key_wins() {
        let text = r#"{"a": {"x": 1.0e2}, "b" : [ 1 ], "a": "\u00e9", "c\n": null}"#;
        assert_eq!(
            members(text).unwrap(),
            vec![
                (Cow::Borrowed("a"), r#""\u00e9""#),
                (Cow::Borrowed("b"), "[ 1 ]"),
                (Cow::Owned("c\n".to_owned()), "null"),
            ]
        );
        assert!(members("[1]").is_err());
        assert!(members("{\"a\": ").is_err());
    }

    /// Keys given more than once, among many (so that the filter's bits collide): each keeps
    /// its first place and its last value, as a parsed `Map` does.
    #[test]
    fn repeated_keys_among_many_keep_their_place_and_last_value() {
        let mut text = String::from("{");
        for n in 0..600u32 {
            // 0..199 three times, interleaved, each time with another value.
            let key = (n * 7) % 200;
            if n > 0 {
                text.push(',');
            }
            text.push_str(&format!("\"k{key}\": {n}"));
        }
        text.push('}');
        let parsed: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
        let scanned: Vec<(String, Value)> = members(&text)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k.into_owned(), serde_json::from_str(v).unwrap()))
            .collect();
        let expected: Vec<(String, Value)> = parsed.into_iter().collect();
        assert_eq!(scanned.len(), 200);
        assert_eq!(scanned, expected);
    }

    /// The scan splits as serde_json does.
    #[test]
    fn members_split_as_serde_json_does() {
        let long = "y".repeat(10_000);
        for text in [
            r#"{}"#.to_owned(),
            r#" { } "#.to_owned(),
            r#"{"a":1}"#.to_owned(),
            r#"{ "a" : [ 1 , { "b" : "]}\"," } ] , "c\"d" : "e\\" , "f": -1.5e3 ,"g":null}"#
                .to_owned(),
            format!(r#"{{"k\u0041": "{long}\"{long}", "n": {{"x": [[], {{}}, "}}"]}}}}"#),
            r#"{"params": {"a": true}, "workspace": {"repository": "r"}}"#.to_owned(),
        ] {
            check(&text).unwrap();
            let by_serde: Vec<(String, String)> = serde_json::from_str::<
                std::collections::BTreeMap<String, &serde_json::value::RawValue>,
            >(&text)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, v.get().to_owned()))
            .collect();
            let mut scanned: Vec<(String, String)> = members(&text)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.into_owned(), v.to_owned()))
                .collect();
            scanned.sort();
            assert_eq!(scanned, by_serde, "{}", &text[..text.len().min(80)]);
        }
    }

    #[test]
    fn kinds_are_read_from_the_first_byte() {
        for (text, kind_) in [
            ("{}", Kind::Object),
            (" [1]", Kind::Array),
            ("\"s\"", Kind::String),
            ("true", Kind::Bool),
            ("false", Kind::Bool),
            ("null", Kind::Null),
            ("-1", Kind::Number),
            ("0.5", Kind::Number),
        ] {
            assert_eq!(kind(text), kind_, "{text}");
            let value: Value = serde_json::from_str(text).unwrap();
            let described = match value {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            };
            assert_eq!(kind_.described(), described);
        }
    }

    #[test]
    fn strings_are_written_as_json_strings() {
        let mut out = String::from("[");
        push_string(&mut out, "a\"b\\c\n\u{1}é");
        out.push(']');
        assert_eq!(out, r#"["a\"b\\c\n\u0001é"]"#);
        assert_eq!(
            serde_json::from_str::<Vec<String>>(&out).unwrap(),
            vec!["a\"b\\c\n\u{1}é"]
        );
    }
}
