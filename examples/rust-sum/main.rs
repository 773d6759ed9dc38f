//! A task body written in Rust: adds `a` and `b`. Built as `perago-example-sum` (a binary of
//! the `perago-tests` package: `cargo build -p perago-tests --bin perago-example-sum`), and
//! started by the supervisor in place of `perago-executor` because the manifest names it in
//! `body.executor`.

#![forbid(unsafe_code)]

use perago_executor::task::{Task, TaskContext, TaskError};
use serde_json::{Map, Value, json};

struct Sum;

impl Task for Sum {
    fn run(&self, ctx: &TaskContext, params: &Map<String, Value>) -> Result<Value, TaskError> {
        let int = |key: &str| params.get(key).and_then(Value::as_i64);
        let a = int("a").ok_or_else(|| TaskError::terminal("params.a must be an integer"))?;
        let b = int("b").unwrap_or(0);
        if let Some(ms) = int("sleep_ms") {
            std::thread::sleep(std::time::Duration::from_millis(ms.max(0) as u64));
        }
        if params.get("panic").is_some() {
            panic!("asked to panic");
        }
        let sum = a
            .checked_add(b)
            .ok_or_else(|| TaskError::retriable("the sum overflows"))?;
        Ok(json!({"sum": sum, "worker": ctx.worker_id}))
    }
}

fn main() {
    std::process::exit(perago_executor::task::main(Sum));
}
