//! Several runtimes side by side ([`run_all`]), with stand-in runtimes.

use super::*;
use tokio::sync::{mpsc, oneshot};

type Outcome = Pin<Box<dyn Future<Output = Result<(), RuntimeError>> + Send>>;
type Run = Box<dyn FnOnce(StopFuture) -> Outcome>;

/// A runtime that drains when told to, and says why on `reasons`.
fn drains(name: &'static str, reasons: &mpsc::UnboundedSender<(&'static str, String)>) -> Run {
    let reasons = reasons.clone();
    Box::new(move |stop: StopFuture| {
        Box::pin(async move {
            let why = stop.await;
            let _ = reasons.send((name, why));
            Ok(())
        }) as Outcome
    })
}

/// A runtime that ends with `error` once `go` fires.
fn fails(go: oneshot::Receiver<()>, error: RuntimeError) -> Run {
    Box::new(move |_stop: StopFuture| {
        Box::pin(async move {
            let _ = go.await;
            Err(error)
        }) as Outcome
    })
}

fn received(
    reasons: &mut mpsc::UnboundedReceiver<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let mut got = Vec::new();
    while let Ok(r) = reasons.try_recv() {
        got.push(r);
    }
    got.sort();
    got
}

/// One runtime failing drains the others with its reason; the results come in order.
#[tokio::test]
async fn one_failing_runtime_drains_the_others() {
    let (tx, mut reasons) = mpsc::unbounded_channel();
    let (go, go_rx) = oneshot::channel();
    let died = RuntimeError::BrokerDied {
        status: "exit status 1".into(),
    };
    let runs: Vec<(String, Run)> = vec![
        ("a".into(), drains("a", &tx)),
        ("b".into(), fails(go_rx, died)),
        ("c".into(), drains("c", &tx)),
    ];
    go.send(()).unwrap();
    let results = run_all(runs, std::future::pending()).await;
    let why = "the runtime of task b stopped (the broker exited (exit status 1) while the runtime was running)";
    assert_eq!(
        received(&mut reasons),
        [("a", why.to_owned()), ("c", why.to_owned())]
    );
    let names: Vec<_> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(results[0].1.is_ok() && results[2].1.is_ok());
    assert!(matches!(results[1].1, Err(RuntimeError::BrokerDied { .. })));
}

/// A runtime that hit its shutdown deadline was draining already: it stops no one; `stop`
/// drains them all with its own reason.
#[tokio::test]
async fn a_force_killed_runtime_stops_no_one_and_stop_drains_all() {
    let (tx, mut reasons) = mpsc::unbounded_channel();
    let (go, go_rx) = oneshot::channel();
    let (done, done_rx) = oneshot::channel::<()>();
    let forced: Run = Box::new(move |_stop: StopFuture| {
        Box::pin(async move {
            let _ = go_rx.await;
            let _ = done.send(());
            Err(RuntimeError::ForceKilled {
                deadline: Duration::from_secs(1),
            })
        }) as Outcome
    });
    let runs: Vec<(String, Run)> = vec![("a".into(), forced), ("b".into(), drains("b", &tx))];
    go.send(()).unwrap();
    let stop = async move {
        let _ = done_rx.await;
        // Let the forced runtime's end be seen first.
        tokio::task::yield_now().await;
        "every workflow ended".to_owned()
    };
    let results = run_all(runs, stop).await;
    assert_eq!(
        received(&mut reasons),
        [("b", "every workflow ended".to_owned())]
    );
    assert!(matches!(
        results[0].1,
        Err(RuntimeError::ForceKilled { .. })
    ));
    assert!(results[1].1.is_ok());
}

/// A runtime whose supervision panicked is a failure that drains the others.
#[tokio::test]
async fn a_panicking_runtime_drains_the_others() {
    let (tx, mut reasons) = mpsc::unbounded_channel();
    let panics: Run = Box::new(|_stop: StopFuture| {
        Box::pin(async {
            panic!("a bug");
            #[allow(unreachable_code)]
            Ok(())
        }) as Outcome
    });
    let runs: Vec<(String, Run)> = vec![("a".into(), panics), ("b".into(), drains("b", &tx))];
    let results = run_all(runs, std::future::pending()).await;
    let got = received(&mut reasons);
    assert_eq!(got.len(), 1);
    assert!(
        got[0]
            .1
            .starts_with("the runtime of task a stopped (the supervision of this runtime failed: "),
        "{got:?}"
    );
    assert!(matches!(results[0].1, Err(RuntimeError::Panicked { .. })));
}
