//! An annotated axum handler: placeholders name identifiers bound inside
//! the extractors' patterns (`Path(item)`, `State(app)`), the lock's errors
//! become the service's error type (`errors = "into"`), and a real router
//! serves it on loopback to concurrent HTTP clients.
//!
//! Without `errors = "into"` the handler would return
//! `Result<T, LockError>`, and axum refuses it (`LockError` is not a
//! response): that, not the future's type, is what made axum's
//! `Handler<_, _>` error.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lock_runtime::{LockError, LockRegistry, distributed_lock};

#[derive(Clone)]
struct App {
    locks: LockRegistry,
    stock: Arc<AtomicU64>,
    sold: Arc<AtomicU64>,
}

enum AppError {
    SoldOut,
    Busy(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> AppError {
        AppError::Busy(err)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::SoldOut => (StatusCode::CONFLICT, "sold out").into_response(),
            AppError::Busy(err) => {
                (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response()
            }
        }
    }
}

/// A non-atomic read, pause, write of the stock: oversells without the lock.
#[distributed_lock(key = "stock:{item}", registry = app.locks, wait_timeout = "10s", errors = "into")]
async fn buy(State(app): State<App>, Path(item): Path<u64>) -> Result<String, AppError> {
    let left = app.stock.load(Ordering::SeqCst);
    if left == 0 {
        return Err(AppError::SoldOut);
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    app.stock.store(left - 1, Ordering::SeqCst);
    app.sold.fetch_add(1, Ordering::SeqCst);
    Ok(format!("bought item {item}, {} left", left - 1))
}

/// Run-time settings, as a service would read them at start-up.
struct Config {
    wait: Duration,
}

static CFG: Config = Config {
    wait: Duration::from_secs(5),
};

#[derive(serde::Serialize)]
struct Receipt {
    item: String,
    left: u64,
}

/// The issue's handler: the global registry, a `String` path, a run-time
/// `wait_timeout` and a JSON answer.
#[distributed_lock(key = "stock:{item}", errors = "into", wait_timeout = CFG.wait)]
async fn receipt(
    State(app): State<App>,
    Path(item): Path<String>,
) -> Result<Json<Receipt>, AppError> {
    let left = app.stock.load(Ordering::SeqCst);
    if left == 0 {
        return Err(AppError::SoldOut);
    }
    app.stock.store(left - 1, Ordering::SeqCst);
    Ok(Json(Receipt {
        item,
        left: left - 1,
    }))
}

/// One HTTP/1.1 request on a fresh connection; the status code.
fn post_status(port: u16, path: &str) -> u16 {
    request(port, path).0
}

/// One HTTP/1.1 request on a fresh connection; the status code and body.
fn request(port: u16, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    (code, body)
}

#[test]
fn an_annotated_handler_serves_concurrent_buyers_without_overselling() {
    serve_concurrent_buyers(|_| LockRegistry::memory());
}

#[test]
fn an_annotated_handler_on_redis_serves_concurrent_buyers_without_overselling() {
    let server = lock_tests::RedisServer::new();
    serve_concurrent_buyers(|runtime| {
        runtime
            .block_on(LockRegistry::redis(&server.url()))
            .expect("connect to the test server")
    });
}

/// 40 clients for 20 items, all at once, through an annotated handler
/// locking in the registry `locks` makes.
fn serve_concurrent_buyers(locks: impl FnOnce(&tokio::runtime::Runtime) -> LockRegistry) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let app = App {
        locks: locks(&runtime),
        stock: Arc::new(AtomicU64::new(20)),
        sold: Arc::new(AtomicU64::new(0)),
    };
    let router = Router::new()
        .route("/buy/{item}", post(buy))
        .with_state(app.clone());
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    runtime.spawn(async move { axum::serve(listener, router).await });
    // 40 clients for 20 items, all at once.
    let clients: Vec<_> = (0..40)
        .map(|_| std::thread::spawn(move || post_status(port, "/buy/7")))
        .collect();
    let codes: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let ok = codes.iter().filter(|&&code| code == 200).count();
    let sold_out = codes.iter().filter(|&&code| code == 409).count();
    assert_eq!((ok, sold_out), (20, 20), "{codes:?}");
    assert_eq!(app.sold.load(Ordering::SeqCst), 20);
    assert_eq!(app.stock.load(Ordering::SeqCst), 0);
}

#[test]
fn the_issues_handler_serves_json_on_the_global_registry() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    lock_runtime::init(LockRegistry::memory()).unwrap();
    let app = App {
        locks: LockRegistry::memory(),
        stock: Arc::new(AtomicU64::new(2)),
        sold: Arc::new(AtomicU64::new(0)),
    };
    let router = Router::new()
        .route("/receipt/{item}", post(receipt))
        .with_state(app);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    runtime.spawn(async move { axum::serve(listener, router).await });
    let (code, body) = request(port, "/receipt/sku-9");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, r#"{"item":"sku-9","left":1}"#);
    assert_eq!(request(port, "/receipt/sku-9").0, 200);
    assert_eq!(request(port, "/receipt/sku-9").0, 409);
}
