//! The library API's lifecycle: addresses and graceful shutdown.

use std::time::Duration;

use perago_devstack::conductor::ConductorServer;

use crate::support::{Dev, eventually};

#[tokio::test]
async fn shutdown_lets_an_in_flight_long_poll_finish_then_refuses_connections() {
    let dev = Dev::start().await;
    assert_eq!(dev.api, format!("http://{}/api", dev.server.addr()));
    let poller = {
        let http = dev.http.clone();
        let url = format!("{}/tasks/poll/batch/idle?timeout=1500", dev.api);
        tokio::spawn(async move {
            let response = http
                .get(url)
                .send()
                .await
                .expect("answered before shutdown ends");
            (response.status(), response.text().await.unwrap())
        })
    };
    eventually("the long poll is waiting", || async {
        let data = dev.get("/tasks/queue/polldata?taskType=idle").await.json();
        (!data.as_array().unwrap().is_empty()).then_some(())
    })
    .await;

    let Dev { server, http, api } = dev;
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown drains within its grace period");
    let (status, body) = poller.await.unwrap();
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(body, "[]");
    assert!(
        http.get(format!("{api}/health")).send().await.is_err(),
        "no longer listening"
    );
}

#[tokio::test]
async fn a_bad_time_scale_is_refused_by_the_builder() {
    for scale in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let error = ConductorServer::builder()
            .time_scale(scale)
            .bind("127.0.0.1:0")
            .await
            .expect_err("invalid scale");
        assert!(error.to_string().contains("time scale"), "{error}");
    }
}
