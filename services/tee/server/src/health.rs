//! Whether this service can serve, kept in one place and read by the gRPC health service
//! (`grpc.health.v1`), the HTTP probes and the handlers.
//!
//! An engine failure that leaves the model unusable (the device lost, say) flips it for
//! good: the process stays up, reports NOT_SERVING for the server and each of its
//! services, and answers every request with UNAVAILABLE and the reason, so routers stop
//! sending to it and a supervisor can replace it. So does an integrity failure (a product
//! that failed U-Verify): that request fails with DATA_LOSS, and an engine that returned
//! one wrong product is not trusted with another, so the service stops serving too.

use std::sync::{Arc, Mutex};

use models::ModelError;
use protocol::EngineError;
use protocol::ProtocolError;
use tokio::sync::watch;
use tonic::Status;
use tonic_health::{
    ServingStatus,
    pb::health_server::HealthServer,
    server::{HealthReporter, HealthService},
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not yet serving (the listener is not open).
    Starting,
    Serving,
    /// The engine failed; the reason says how. Final.
    Failed(String),
}

/// A cheap handle on the service's health; clones share it.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    services: Arc<Mutex<Vec<&'static str>>>,
    state: Arc<watch::Sender<State>>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

impl Health {
    pub fn new() -> Self {
        Health {
            reporter: HealthReporter::new(),
            services: Arc::default(),
            state: Arc::new(watch::Sender::new(State::Starting)),
        }
    }

    /// A gRPC service (its full name, e.g. `gelo.v1.Embedder`) whose health status follows
    /// this one, as the server's overall status ("") does.
    pub fn add_service(&self, name: &'static str) {
        self.services.lock().expect("health services").push(name);
    }

    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// The listener is open: serving, unless the engine already failed.
    pub fn set_serving(&self) {
        self.state.send_if_modified(|s| {
            let starting = *s == State::Starting;
            if starting {
                *s = State::Serving;
            }
            starting
        });
    }

    /// Stops serving for good; the first reason is kept.
    pub fn fail(&self, reason: impl Into<String>) {
        let reason = reason.into();
        let first = self.state.send_if_modified(|s| {
            if matches!(s, State::Failed(_)) {
                return false;
            }
            *s = State::Failed(reason.clone());
            true
        });
        if first {
            tracing::error!(%reason, "the engine failed: this service reports NOT_SERVING and refuses requests");
        }
    }

    /// Fails the service if `e` leaves the engine unable to serve anything, or shows it
    /// returned a wrong product.
    pub fn observe(&self, e: &ModelError) {
        if let Some(engine) = fatal_engine_error(e) {
            self.fail(format!("engine {engine}"));
        } else if let ModelError::Protocol(ProtocolError::Integrity(v)) = e {
            self.fail(format!("integrity: the engine returned a product that failed U-Verify ({v})"));
        }
    }

    /// `UNAVAILABLE` with the reason once the engine has failed.
    pub fn check(&self) -> Result<(), Status> {
        match &*self.state.borrow() {
            State::Failed(reason) => Err(Status::unavailable(format!("service not serving: {reason}"))),
            _ => Ok(()),
        }
    }

    /// The `grpc.health.v1.Health` service reporting this state.
    pub fn grpc_service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Sets the gRPC statuses from the current state, then keeps them following it; runs
    /// until aborted (`serve` does when it returns).
    pub async fn follow(self) {
        let mut rx = self.state.subscribe();
        loop {
            let state = rx.borrow_and_update().clone();
            self.apply(&state).await;
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Sets the gRPC statuses of "" and every added service from `state`.
    pub async fn apply(&self, state: &State) {
        let status = match state {
            State::Serving => ServingStatus::Serving,
            State::Starting | State::Failed(_) => ServingStatus::NotServing,
        };
        let names: Vec<&'static str> = self.services.lock().expect("health services").clone();
        self.reporter.set_service_status("", status).await;
        for name in names {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// An engine failure after which no request can be served: the device or its adapter is
/// gone, or the engine no longer holds the weights it was provisioned with.
pub fn fatal_engine_error(e: &ModelError) -> Option<&EngineError> {
    match e {
        ModelError::Protocol(ProtocolError::Engine(
            engine @ (EngineError::DeviceLost(_) | EngineError::NoAdapter(_) | EngineError::UnknownWeight(_)),
        )) => Some(engine),
        _ => None,
    }
}
