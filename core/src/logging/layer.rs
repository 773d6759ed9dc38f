//! The layer that writes a worker's lines: each event's fields are read once and written both
//! as a text line (stderr) and as a JSON line (the worker's JSONL file, when it has one), from
//! one reading of the clock.
//!
//! The text line reads as `tracing-subscriber`'s full format did:
//! `2026-12-05T07:33:42.123456Z  INFO assignment{task_id="t-1"}: message field=value`, with
//! every control character of a message or a value written out (`\x1b`), so that nothing a
//! body or a server said can drive the terminal. A JSON line carries `ts_ms`, `level`,
//! `worker_id`, `message`, then the event's fields and those of its spans (innermost first,
//! each name once).

use super::sink::LineBuffer;
use std::{
    fmt::Write as _,
    io,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};
use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{Layer, layer::Context, registry::LookupSpan};

/// Appends `text` to `out` as a JSON string (quoted and escaped).
pub(super) fn push_json_str(out: &mut Vec<u8>, text: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// Appends `text` to `out` with every control character but tab written out: C0 and DEL as
/// `\xNN`, C1 as `\u{NN}` (a terminal takes `\u{9b}` as the start of an escape sequence too).
/// A newline too: one event, one line.
fn push_text(out: &mut Vec<u8>, text: &str) {
    let clean = |c: char| c == '\t' || !c.is_control();
    if text.chars().all(clean) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    for c in text.chars() {
        if clean(c) {
            let mut utf8 = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        } else if (c as u32) < 0x80 {
            let _ = write!(VecWriter(out), "\\x{:02x}", c as u32);
        } else {
            let _ = write!(VecWriter(out), "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `fmt::Write` into a byte buffer.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The names a JSON line sets itself: an event field of the same name is left out of it.
const RESERVED: [&str; 4] = ["ts_ms", "level", "worker_id", "message"];

/// An event's or a span's fields, read once: its message, its fields as JSON members
/// (`,"name":value`) and as text (` name=value`).
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) message: String,
    /// The JSON members' names, in order; `json_ends[i]` is where member `i` ends in `json`.
    names: Vec<&'static str>,
    json: Vec<u8>,
    json_ends: Vec<usize>,
    text: Vec<u8>,
    /// Where a `Debug` or `Display` value is rendered before it is written as JSON and as text.
    rendered: String,
}

impl Fields {
    /// Empties the fields, keeping their buffers unless one grew past [`KEEP_AT_MOST`].
    fn clear(&mut self) {
        let big = self.message.capacity() > KEEP_AT_MOST
            || self.json.capacity() > KEEP_AT_MOST
            || self.text.capacity() > KEEP_AT_MOST
            || self.rendered.capacity() > KEEP_AT_MOST
            || self.names.capacity() > KEEP_AT_MOST / 8;
        if big {
            *self = Self::default();
            return;
        }
        self.message.clear();
        self.names.clear();
        self.json.clear();
        self.json_ends.clear();
        self.text.clear();
        self.rendered.clear();
    }

    /// Adds a field: `text` writes its text, then `json` its JSON value (given the text just
    /// written, for a value written the same in both).
    fn add(
        &mut self,
        field: &Field,
        json: impl FnOnce(&mut Vec<u8>, &[u8]),
        text: impl FnOnce(&mut Vec<u8>),
    ) {
        let name = field.name();
        self.text.push(b' ');
        self.text.extend_from_slice(name.as_bytes());
        self.text.push(b'=');
        let start = self.text.len();
        text(&mut self.text);
        if RESERVED.contains(&name) {
            return;
        }
        self.json.push(b',');
        push_json_str(&mut self.json, name);
        self.json.push(b':');
        json(&mut self.json, &self.text[start..]);
        self.names.push(name);
        self.json_ends.push(self.json.len());
    }

    /// Adds a field written the same in JSON and text (a number, a boolean).
    /// Rendered once, into the text, and copied from there into the JSON (no buffer of its
    /// own).
    fn add_plain(&mut self, field: &Field, value: std::fmt::Arguments<'_>) {
        self.add(
            field,
            |out, text| out.extend_from_slice(text),
            |out| {
                let _ = VecWriter(out).write_fmt(value);
            },
        );
    }

    /// Each JSON member's name and text (`,"name":value`).
    fn members(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        let starts = std::iter::once(0).chain(self.json_ends.iter().copied());
        self.names
            .iter()
            .zip(starts.zip(self.json_ends.iter().copied()))
            .map(|(name, (start, end))| (*name, &self.json[start..end]))
    }

    /// Adds the members of an enclosing span's fields whose names this one lacks.
    fn inherit(&mut self, outer: &Fields) {
        for (name, member) in outer.members() {
            if !self.names.contains(&name) {
                self.names.push(name);
                self.json.extend_from_slice(member);
                self.json_ends.push(self.json.len());
            }
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.message);
        } else {
            self.add(
                field,
                |out, _| push_json_str(out, value),
                // Quoted, its control characters escaped (`Debug` of a str).
                |out| {
                    let _ = write!(VecWriter(out), "{value:?}");
                },
            );
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.add_plain(field, format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.add_plain(field, format_args!("{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.add_plain(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message.clear();
            let _ = write!(self.message, "{value:?}");
        } else {
            let mut rendered = std::mem::take(&mut self.rendered);
            rendered.clear();
            let _ = write!(rendered, "{value:?}");
            self.add(
                field,
                |out, _| push_json_str(out, &rendered),
                |out| push_text(out, &rendered),
            );
            self.rendered = rendered;
        }
    }
}

/// A span's fields, kept in its extensions: every event inside the span carries them.
struct SpanFields(Fields);

/// The most a buffer kept between events may hold: one that grew past it (a long message, a
/// big value) is let go rather than kept for the thread's life.
const KEEP_AT_MOST: usize = 16 * 1024;

/// What a thread writes its events with, kept between events so that a line costs no
/// allocation once the buffers have grown to fit: the event's fields and the line being
/// written.
#[derive(Default)]
struct Scratch {
    fields: Fields,
    line: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// `2026-12-05T07:33:42.123456Z`: UTC, microseconds.
pub(super) fn push_timestamp(out: &mut Vec<u8>, since_epoch: std::time::Duration) {
    let secs = since_epoch.as_secs();
    let (days, secs_of_day) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let _ = write!(
        VecWriter(out),
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60,
        since_epoch.subsec_micros()
    );
}

/// The level as the text line shows it (five columns), and its colour.
fn level_text(level: Level) -> (&'static str, &'static str) {
    match level {
        Level::ERROR => ("ERROR", "\x1b[31m"),
        Level::WARN => (" WARN", "\x1b[33m"),
        Level::INFO => (" INFO", "\x1b[32m"),
        Level::DEBUG => ("DEBUG", "\x1b[34m"),
        Level::TRACE => ("TRACE", "\x1b[35m"),
    }
}

/// The tracing layer that writes a worker's (or the supervisor's) lines.
pub(super) struct WorkerLayer {
    stderr: Arc<LineBuffer>,
    /// Colours on stderr (it is a terminal).
    ansi: bool,
    /// `"worker_id":"<id>"` (escaped once) and the worker's JSONL file, when it has one.
    jsonl: Option<(Vec<u8>, Arc<LineBuffer>)>,
    /// The JSONL file's registration with the fatal-signal handler, ended with the layer.
    _kept: Option<super::sink::Kept>,
}

impl WorkerLayer {
    /// Lines to `stderr`, and to `jsonl` as `worker_id` when given.
    pub(super) fn new(stderr: Arc<LineBuffer>, jsonl: Option<(&str, Arc<LineBuffer>)>) -> Self {
        Self {
            stderr,
            ansi: io::IsTerminal::is_terminal(&io::stderr()),
            jsonl: jsonl.map(|(worker_id, file)| {
                let mut member = b"\"worker_id\":".to_vec();
                push_json_str(&mut member, worker_id);
                (member, file)
            }),
            _kept: None,
        }
    }

    /// The layer, with the registration that has a fatal signal write its file's held lines.
    pub(super) fn keeping(self, kept: Option<super::sink::Kept>) -> Self {
        Self {
            _kept: kept,
            ..self
        }
    }

    /// Writes the text line into `line`: time, level, the spans outermost first with their
    /// fields, the message, the event's fields.
    fn text_line<S>(
        &self,
        line: &mut Vec<u8>,
        event: &Event<'_>,
        fields: &Fields,
        since_epoch: std::time::Duration,
        ctx: &Context<'_, S>,
    ) where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        line.reserve(128 + fields.message.len() + fields.text.len());
        let (level, colour) = level_text(*event.metadata().level());
        if self.ansi {
            line.extend_from_slice(b"\x1b[2m");
        }
        push_timestamp(line, since_epoch);
        if self.ansi {
            line.extend_from_slice(b"\x1b[0m ");
            line.extend_from_slice(colour.as_bytes());
            line.extend_from_slice(level.as_bytes());
            line.extend_from_slice(b"\x1b[0m ");
        } else {
            line.push(b' ');
            line.extend_from_slice(level.as_bytes());
            line.push(b' ');
        }
        if let Some(scope) = ctx.event_scope(event) {
            let mut any = false;
            for span in scope.from_root() {
                any = true;
                line.extend_from_slice(span.name().as_bytes());
                let extensions = span.extensions();
                if let Some(SpanFields(outer)) = extensions.get::<SpanFields>()
                    && let Some(text) = outer.text.strip_prefix(b" ")
                {
                    line.push(b'{');
                    line.extend_from_slice(text);
                    line.push(b'}');
                }
                line.push(b':');
            }
            if any {
                line.push(b' ');
            }
        }
        push_text(line, &fields.message);
        line.extend_from_slice(&fields.text);
        line.push(b'\n');
    }

    /// Writes the JSON line into `line`: `ts_ms`, `level`, `worker_id`, `message`, then the
    /// fields in order.
    fn json_line(
        line: &mut Vec<u8>,
        worker_member: &[u8],
        level: Level,
        ts_ms: u128,
        fields: &Fields,
    ) {
        line.reserve(96 + fields.message.len() + fields.json.len());
        let _ = write!(VecWriter(line), "{{\"ts_ms\":{ts_ms},\"level\":");
        push_json_str(line, level.as_str());
        line.push(b',');
        line.extend_from_slice(worker_member);
        line.extend_from_slice(b",\"message\":");
        push_json_str(line, &fields.message);
        line.extend_from_slice(&fields.json);
        line.extend_from_slice(b"}\n");
    }

    /// Writes `event`'s lines with `scratch`'s buffers, and leaves them empty.
    fn write_event<S>(&self, event: &Event<'_>, ctx: &Context<'_, S>, scratch: &mut Scratch)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let Scratch { fields, line } = scratch;
        // Empty already, unless a panic cut the last event short.
        fields.clear();
        line.clear();
        self.write_lines(event, ctx, fields, line);
        // Emptied now too, so that a long line's buffers are let go at once.
        fields.clear();
        if line.capacity() > KEEP_AT_MOST {
            *line = Vec::new();
        }
    }

    /// Writes `event`'s text line, then its JSON line, reading its fields into `fields` and
    /// each line into `line` in turn.
    fn write_lines<S>(
        &self,
        event: &Event<'_>,
        ctx: &Context<'_, S>,
        fields: &mut Fields,
        line: &mut Vec<u8>,
    ) where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        event.record(fields);
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let level = *event.metadata().level();
        // A warning or an error is not held: it is what a crash must not take with it.
        let urgent = level <= Level::WARN;
        self.text_line(line, event, fields, since_epoch, ctx);
        self.stderr.push(line, urgent);
        let Some((worker_member, file)) = &self.jsonl else {
            return;
        };
        // The fields of the spans the event is in, innermost first, each name once.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(SpanFields(outer)) = span.extensions().get::<SpanFields>() {
                    fields.inherit(outer);
                }
            }
        }
        line.clear();
        Self::json_line(line, worker_member, level, since_epoch.as_millis(), fields);
        file.push(line, urgent);
    }
}

impl<S> Layer<S> for WorkerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        // Kept for the span's life: not its rendering buffer.
        fields.rendered = String::new();
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(SpanFields(fields)) = span.extensions_mut().get_mut::<SpanFields>()
        {
            values.record(fields);
            fields.rendered = String::new();
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // The thread's buffers, unless they cannot be had: a thread being torn down, or one
        // already writing an event (tracing does not hand this thread an event logged from
        // inside a callback, a value's `Debug` say, so that is only a guard), writes with
        // buffers of its own.
        let written = SCRATCH.try_with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => {
                self.write_event(event, &ctx, &mut scratch);
                true
            }
            Err(_) => false,
        });
        if written != Ok(true) {
            self.write_event(event, &ctx, &mut Scratch::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_MAX_BYTES, file::RotatingFile, sink::Output};
    use super::*;
    use std::fs;

    fn file_layer(worker_id: &str, dir: &std::path::Path) -> WorkerLayer {
        let file = RotatingFile::open(dir, DEFAULT_MAX_BYTES, 1).unwrap();
        WorkerLayer::new(
            LineBuffer::new(Output::Memory(Vec::new())),
            Some((worker_id, LineBuffer::new(Output::File(file)))),
        )
    }

    #[test]
    fn timestamps_are_utc_rfc3339_with_microseconds() {
        let text = |secs: u64, micros: u32| {
            let mut out = Vec::new();
            push_timestamp(&mut out, std::time::Duration::new(secs, micros * 1000));
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(text(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(text(1_796_456_022, 123_456), "2026-12-05T07:33:42.123456Z");
        assert_eq!(text(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(text(1_709_164_800, 0), "2024-02-29T00:00:00.000000Z");
        assert_eq!(text(1_735_689_599, 0), "2024-12-31T23:59:59.000000Z");
        assert_eq!(text(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
    }

    #[test]
    fn control_characters_are_written_out_in_text() {
        let mut out = Vec::new();
        push_text(&mut out, "ok \u{1b}[2J\r\n\t\u{7f}\u{9b}1m é");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ok \\x1b[2J\\x0d\\x0a\t\\x7f\\u{9b}1m é"
        );
    }

    /// The text line: time, level, the spans outermost first with their fields, the message
    /// and the event's fields; strings quoted, `%` values as they display, control
    /// characters written out everywhere.
    #[test]
    fn a_text_line_reads_as_the_full_format() {
        use tracing_subscriber::prelude::*;
        let stderr = LineBuffer::new(Output::Memory(Vec::new()));
        let layer = WorkerLayer {
            stderr: Arc::clone(&stderr),
            ansi: false,
            jsonl: None,
            _kept: None,
        };
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(generation = 2u64, "attached");
            let outer = tracing::info_span!("assignment", task_id = "t-1", n = 3i64);
            let _in = outer.enter();
            let inner = tracing::info_span!("publish");
            inner.in_scope(|| {
                tracing::warn!(status = "FAILED", why = %"body\u{1b}[31m", ok = false, "said\n\u{1b}[2J");
            });
        });
        let lines: Vec<String> = stderr
            .written()
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let (ts, rest) = lines[0].split_at(27);
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
        assert_eq!(rest, "  INFO attached generation=2\n");
        assert_eq!(
            &lines[1][27..],
            "  WARN assignment{task_id=\"t-1\" n=3}:publish: said\\x0a\\x1b[2J \
             status=\"FAILED\" why=body\\x1b[31m ok=false\n"
        );
    }

    /// Each line is one JSON object: the layer's own members first (an event field of the
    /// same name is left out), then the event's fields in order, every string escaped.
    #[test]
    fn a_line_is_json_with_the_layers_members_first() {
        use tracing_subscriber::prelude::*;
        let tmp = tempfile::tempdir().unwrap();
        let layer = file_layer("w\"0001", tmp.path());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                task_id = "t-1", n = 7u64, neg = -3i64, ok = true, worker_id = "other",
                debug = ?vec![1, 2], "said \"hi\"\n{}", "twice"
            );
        });
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert!(text.ends_with('\n'));
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "ts_ms",
                "level",
                "worker_id",
                "message",
                "task_id",
                "n",
                "neg",
                "ok",
                "debug"
            ]
        );
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["worker_id"], "w\"0001");
        assert_eq!(line["message"], "said \"hi\"\ntwice");
        assert_eq!(line["n"], 7);
        assert_eq!(line["neg"], -3);
        assert_eq!(line["ok"], true);
        assert_eq!(line["debug"], "[1, 2]");
        assert!(line["ts_ms"].as_u64().unwrap() > 1_700_000_000_000);
    }

    /// Events inside spans carry the spans' fields (innermost first); the event's own field
    /// of the same name wins, a field recorded later on the span is carried too, and an event
    /// outside every span carries none.
    #[test]
    fn events_carry_the_fields_of_their_spans() {
        use tracing_subscriber::prelude::*;
        let tmp = tempfile::tempdir().unwrap();
        let layer = file_layer("w0001", tmp.path());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let assignment = tracing::info_span!(
                "assignment",
                task_id = "t-1",
                execution_id = "e-1",
                worker_id = "ignored",
                phase = tracing::field::Empty
            );
            let _in = assignment.enter();
            tracing::info!(stream = "stderr", "from the body");
            let inner = tracing::info_span!("publish", execution_id = "e-inner", files = 3u64);
            inner.in_scope(|| tracing::info!(task_id = "t-own", "published"));
            assignment.record("phase", "body");
            tracing::info!("later");
            drop(_in);
            tracing::info!("outside");
        });
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0]["task_id"], "t-1");
        assert_eq!(lines[0]["execution_id"], "e-1");
        assert_eq!(lines[0]["stream"], "stderr");
        assert_eq!(lines[0]["worker_id"], "w0001", "the line's own");
        assert_eq!(lines[1]["task_id"], "t-own", "the event's own wins");
        assert_eq!(
            lines[1]["execution_id"], "e-inner",
            "the innermost span wins"
        );
        assert_eq!(lines[1]["files"], 3);
        assert_eq!(lines[2]["phase"], "body");
        assert_eq!(lines[2]["task_id"], "t-1");
        assert!(lines[3].get("task_id").is_none(), "{}", lines[3]);
    }

    /// A runtime thread's lines wait for it to go idle, both outputs; a warning does not.
    #[test]
    fn a_holding_threads_info_lines_wait_and_its_warnings_do_not() {
        use tracing_subscriber::prelude::*;
        let stderr = LineBuffer::new(Output::Memory(Vec::new()));
        let file = LineBuffer::new(Output::Memory(Vec::new()));
        let layer = WorkerLayer::new(Arc::clone(&stderr), Some(("w1", Arc::clone(&file))));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let holding = super::super::sink::hold_lines();
            tracing::info!("one");
            tracing::info!("two");
            assert!(stderr.written().is_empty() && file.written().is_empty());
            super::super::sink::flush_held();
            assert_eq!((stderr.written().len(), file.written().len()), (1, 1));
            assert_eq!(
                String::from_utf8_lossy(&file.written()[0]).lines().count(),
                2
            );
            tracing::info!("three");
            tracing::warn!("four");
            let text = String::from_utf8_lossy(&stderr.written()[1]).into_owned();
            assert!(text.contains("three") && text.contains("four"), "{text}");
            drop(holding);
        });
    }

    /// A line after a long one carries nothing of it, and the thread does not keep the long
    /// line's buffers.
    #[test]
    fn a_long_line_is_not_kept_by_the_thread() {
        use tracing_subscriber::prelude::*;
        let tmp = tempfile::tempdir().unwrap();
        let subscriber = tracing_subscriber::registry().with(file_layer("w-1", tmp.path()));
        let long = "x".repeat(4 * KEEP_AT_MOST);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(big = %long, "{long}");
            tracing::info!(small = 1u64, "short");
            tracing::info!(big = %long, "{long}");
        });
        SCRATCH.with(|scratch| {
            let scratch = scratch.borrow();
            let fields = &scratch.fields;
            for (what, capacity) in [
                ("line", scratch.line.capacity()),
                ("message", fields.message.capacity()),
                ("json", fields.json.capacity()),
                ("text", fields.text.capacity()),
                ("rendered", fields.rendered.capacity()),
            ] {
                assert!(capacity <= KEEP_AT_MOST, "{what} keeps {capacity} bytes");
            }
        });
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["big"].as_str().unwrap().len(), long.len());
        assert_eq!(lines[1]["message"], "short");
        assert_eq!(lines[1].get("big"), None);
    }
}
