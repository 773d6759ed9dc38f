//! JSON from servers and the slot protocol, nested as deep as Conductor allows. serde_json
//! stops at 128 levels, but Conductor accepts task input nested up to 1,000 levels: one such
//! task must not make a whole batch (or a result update's answer) undecodable. Depth is
//! measured first, iteratively, so nothing deeper than [`MAX_DEPTH`] is ever parsed
//! recursively.

use serde::de::Deserialize as _;
use serde_json::Value;

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
            .map_err(|e| JsonError::Syntax(e.to_string()))?;
        de.end().map_err(|e| JsonError::Syntax(e.to_string()))?;
        return Ok(value);
    }
    let value = Value::deserialize(&mut de).map_err(|e| JsonError::Syntax(e.to_string()))?;
    de.end().map_err(|e| JsonError::Syntax(e.to_string()))?;
    Ok(value)
}

/// The length of `value`'s compact JSON text, counted without building it.
pub fn encoded_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot serialize counts what it wrote.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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

    #[test]
    fn encoded_len_is_the_length_of_the_text() {
        let v = serde_json::json!({"a": [1, "é", null], "b": {"c": 1.5}});
        assert_eq!(encoded_len(&v), serde_json::to_string(&v).unwrap().len());
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
}
