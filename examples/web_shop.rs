//! The flash sale as a web service: `POST /buy/{item}` is an annotated axum
//! handler, `LockError` becomes an HTTP status, `/metrics` serves the
//! locks' metrics to Prometheus, and `/locks/{item}` lets an operator see
//! who holds an item's lock and free it.
//!
//! ```sh
//! cargo run -p examples --features web --example web_shop                # in memory
//! cargo run -p examples --features web --example web_shop -- --redis redis://127.0.0.1:6379
//! curl -X POST localhost:3000/buy/sku-1        # {"item":"sku-1","left":9,"fencing_token":1}
//! curl localhost:3000/locks/sku-1              # {"held":false,...}
//! curl -X DELETE localhost:3000/locks/sku-1    # an operator frees a stuck lock
//! curl localhost:3000/metrics                  # distributed_lock_acquired_total{...} 1
//! ```
//!
//! Options: `--listen ADDR` (127.0.0.1:3000; port 0 picks a free one, and
//! the address is printed), `--stock N` (10 per item), `--pause-ms N` (5,
//! between reading and writing the stock), `--wait-ms N` (1000, how long a
//! buyer waits for the item's lock), `--redis URL` (the lock store and the
//! stock, shared by every instance started with it).
//!
//! How `LockError` maps to statuses (see `ApiError` below):
//!
//! | error | status | why |
//! |---|---|---|
//! | `Timeout` | 503 with `Retry-After` | the item is busy; the client may retry |
//! | `Lost` | 409 | the lease ended mid-purchase (the body was cancelled before it wrote); retry |
//! | `Store` | 503 with `Retry-After` | the lock store is unreachable; nothing was done |
//! | `InvalidKey` | 400 | the item name cannot be a key (too long) |
//! | anything else | 500 | a bug: bad options, no registry |

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use examples::{Error, StoreFlag};
use lock_runtime::{LockError, LockRegistry, distributed_lock, fencing_token};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redis::AsyncCommands;
use serde::Serialize;

struct Args {
    listen: String,
    stock: u64,
    pause: Duration,
    wait: Duration,
    store: StoreFlag,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        listen: "127.0.0.1:3000".into(),
        stock: 10,
        pause: Duration::from_millis(5),
        wait: Duration::from_millis(1000),
        store: StoreFlag::Memory,
    };
    args.store = examples::parse_flags("web_shop", |flag, value| {
        match flag {
            "--listen" => args.listen = value()?,
            "--stock" => args.stock = value()?.parse()?,
            "--pause-ms" => args.pause = Duration::from_millis(value()?.parse()?),
            "--wait-ms" => args.wait = Duration::from_millis(value()?.parse()?),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if matches!(args.store, StoreFlag::Memory | StoreFlag::Redis(_)) {
        Ok(args)
    } else {
        Err("web_shop keeps its stock in memory or in Redis: give --redis URL or no store".into())
    }
}

/// Where the stock lives: in this process, or in Redis for every instance.
enum Stock {
    Memory(Mutex<HashMap<String, u64>>),
    Redis(redis::aio::MultiplexedConnection),
}

struct App {
    locks: LockRegistry,
    stock: Stock,
    initial: u64,
    pause: Duration,
    wait: Duration,
    metrics: PrometheusHandle,
}

impl App {
    /// A plain read: the race is between this and `write`.
    async fn read(&self, item: &str) -> Result<u64, ApiError> {
        match &self.stock {
            Stock::Memory(stock) => {
                let stock = stock.lock().expect("stock");
                Ok(stock.get(item).copied().unwrap_or(self.initial))
            }
            Stock::Redis(conn) => {
                let left: Option<u64> = conn.clone().get(format!("shop:stock:{item}")).await?;
                Ok(left.unwrap_or(self.initial))
            }
        }
    }

    async fn write(&self, item: &str, left: u64) -> Result<(), ApiError> {
        match &self.stock {
            Stock::Memory(stock) => {
                stock.lock().expect("stock").insert(item.to_owned(), left);
            }
            Stock::Redis(conn) => {
                let () = conn.clone().set(format!("shop:stock:{item}"), left).await?;
            }
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct Receipt {
    item: String,
    left: u64,
    fencing_token: u64,
}

/// The handler: one buyer of `item` at a time across every instance. A
/// read, a pause, a write: without the lock, concurrent buyers oversell.
#[distributed_lock(key = "stock:{item}", name = "stock", errors = "into",
                   wait_timeout = app.wait, registry = app.locks)]
async fn buy(
    State(app): State<Arc<App>>,
    Path(item): Path<String>,
) -> Result<Json<Receipt>, ApiError> {
    let left = app.read(&item).await?;
    if left == 0 {
        return Err(ApiError::SoldOut(item));
    }
    tokio::time::sleep(app.pause).await;
    app.write(&item, left - 1).await?;
    Ok(Json(Receipt {
        item,
        left: left - 1,
        fencing_token: fencing_token().await?,
    }))
}

#[derive(Serialize)]
struct LockState {
    held: bool,
    remaining_ms: Option<u128>,
    fencing_token: Option<u64>,
    held_by_this_process: bool,
}

/// `GET /locks/{item}`: who holds the item's lock.
async fn inspect(
    State(app): State<Arc<App>>,
    Path(item): Path<String>,
) -> Result<Json<LockState>, ApiError> {
    let info = app.locks.inspect(&format!("stock:{item}")).await?;
    Ok(Json(LockState {
        held: info.is_some(),
        remaining_ms: info
            .as_ref()
            .and_then(|i| i.remaining)
            .map(|r| r.as_millis()),
        fencing_token: info.as_ref().map(|i| i.fencing_token),
        held_by_this_process: info.is_some_and(|i| i.held_by_this_process),
    }))
}

/// `DELETE /locks/{item}`: frees a stuck lock (the holder, if alive, is
/// cancelled at its next renewal).
async fn free(
    State(app): State<Arc<App>>,
    Path(item): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let freed = app.locks.force_release(&format!("stock:{item}")).await?;
    Ok(Json(serde_json::json!({ "freed": freed })))
}

/// `GET /metrics`: the Prometheus text format.
async fn scrape(State(app): State<Arc<App>>) -> String {
    app.metrics.render()
}

/// The service's errors, and the status each one is answered with.
#[derive(Debug)]
enum ApiError {
    SoldOut(String),
    Lock(LockError),
    Stock(redis::RedisError),
}

impl From<LockError> for ApiError {
    fn from(err: LockError) -> Self {
        ApiError::Lock(err)
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(err: redis::RedisError) -> Self {
        ApiError::Stock(err)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, retry_after, message) = match &self {
            ApiError::SoldOut(item) => (StatusCode::CONFLICT, None, format!("{item} is sold out")),
            ApiError::Lock(err) => {
                let (status, retry) = lock_status(err);
                (status, retry, err.to_string())
            }
            ApiError::Stock(err) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(1),
                format!("the stock store failed: {err}"),
            ),
        };
        let mut response = (status, message).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The status for a lock error, and a `Retry-After` in seconds where a
/// retry may succeed ([`LockError::http_status`]).
fn lock_status(err: &LockError) -> (StatusCode, Option<u64>) {
    let (status, retry_after) = err.http_status();
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, retry_after.map(|after| after.as_secs().max(1)))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let (locks, stock) = match &args.store {
        StoreFlag::Redis(url) => {
            let conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            (LockRegistry::redis(url).await?, Stock::Redis(conn))
        }
        _ => (
            LockRegistry::memory(),
            Stock::Memory(Mutex::new(HashMap::new())),
        ),
    };
    let app = Arc::new(App {
        locks,
        stock,
        initial: args.stock,
        pause: args.pause,
        wait: args.wait,
        metrics,
    });
    let router = Router::new()
        .route("/buy/{item}", post(buy))
        .route("/locks/{item}", get(inspect).delete(free))
        .route("/metrics", get(scrape))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!(
        "web_shop listening on http://{} ({} store, stock {} per item)",
        listener.local_addr()?,
        args.store.name(),
        args.stock
    );
    axum::serve(listener, router).await?;
    Ok(())
}
