//! The operation registry: which long operations run and which finished.
//!
//! The registry does not admit: the instance does (the driver's `submit`, answered by the
//! instance actor: one operation at a time, a delete next to a running one). An operation the
//! instance admitted is recorded ([`Operations::record`]) before its background task starts;
//! a busy answer names the API operation that runs ([`Operations::running_for`]). Finished
//! operations are kept for polling, at most `keep` of them
//! (config `finished_operations`, default 1024): the oldest is forgotten first, after which
//! `GET /v1/operations/{id}` answers 404. At shutdown the registry is closed (new admissions get
//! 503), drained until a deadline, and what is left is aborted and recorded as failed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::model::{rfc3339, ErrorDetail, OpKind, OpState, OpStatus};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug)]
struct Running {
    op: OpStatus,
    abort: Option<AbortHandle>,
}

#[derive(Debug, Default)]
struct Inner {
    closed: bool,
    running: HashMap<Uuid, Running>,
    by_instance: HashMap<Uuid, Vec<Uuid>>,
    finished: VecDeque<OpStatus>,
}

/// The registry. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Operations {
    inner: Mutex<Inner>,
    keep: usize,
    running_tx: watch::Sender<usize>,
}

impl Operations {
    /// A registry keeping at most `keep` finished operations.
    pub fn new(keep: usize) -> Self {
        Operations {
            inner: Mutex::new(Inner::default()),
            keep: keep.max(1),
            running_tx: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, inner: &Inner) {
        self.running_tx.send_replace(inner.running.len());
    }

    /// Record a `kind` operation the instance admitted (the driver decides admission; a
    /// delete may run next to another operation of the same instance).
    pub fn record(&self, instance: Uuid, kind: OpKind) -> OpStatus {
        let mut inner = self.lock();
        let started = now_ms();
        let op = OpStatus {
            id: Uuid::new_v4(),
            instance,
            kind,
            state: OpState::Running,
            started_ms: started,
            started_at: rfc3339(started),
            finished_ms: None,
            finished_at: None,
            report: None,
            error: None,
        };
        inner.by_instance.entry(instance).or_default().push(op.id);
        inner.running.insert(
            op.id,
            Running {
                op: op.clone(),
                abort: None,
            },
        );
        self.publish(&inner);
        op
    }

    fn unlink(inner: &mut Inner, instance: Uuid, id: Uuid) {
        if let Some(ids) = inner.by_instance.get_mut(&instance) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                inner.by_instance.remove(&instance);
            }
        }
    }

    /// Record the task of a running operation, so shutdown can abort it.
    pub fn attach(&self, id: Uuid, abort: AbortHandle) {
        if let Some(r) = self.lock().running.get_mut(&id) {
            r.abort = Some(abort);
        }
    }

    /// Move a running operation to the finished list. Returns it, or `None` when it was no
    /// longer running (aborted at shutdown).
    pub fn finish(&self, id: Uuid, result: Result<Value, ErrorDetail>) -> Option<OpStatus> {
        let mut inner = self.lock();
        let r = inner.running.remove(&id)?;
        Self::unlink(&mut inner, r.op.instance, id);
        let mut op = r.op;
        let finished = now_ms();
        op.finished_ms = Some(finished);
        op.finished_at = Some(rfc3339(finished));
        match result {
            Ok(report) => {
                op.state = OpState::Succeeded;
                op.report = Some(report);
            }
            Err(e) => {
                op.state = OpState::Failed;
                op.error = Some(e);
            }
        }
        inner.finished.push_back(op.clone());
        while inner.finished.len() > self.keep {
            inner.finished.pop_front();
        }
        self.publish(&inner);
        Some(op)
    }

    /// One operation, running or finished (and not yet forgotten).
    pub fn get(&self, id: Uuid) -> Option<OpStatus> {
        let inner = self.lock();
        if let Some(r) = inner.running.get(&id) {
            return Some(r.op.clone());
        }
        inner.finished.iter().rev().find(|o| o.id == id).cloned()
    }

    /// One operation once it no longer runs, or as it is at `deadline` if it still does (a
    /// caller's long poll: `GET /v1/operations/{id}?wait=S`). `None` when unknown.
    pub async fn wait_finished(&self, id: Uuid, deadline: Instant) -> Option<OpStatus> {
        // Subscribed before the first read: a finish after it marks the channel changed.
        let mut rx = self.running_tx.subscribe();
        loop {
            let op = self.get(id)?;
            if op.state != OpState::Running {
                return Some(op);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // The deadline, or the registry gone: the operation as it is now.
                _ => return self.get(id),
            }
        }
    }

    /// The running operation of an instance (the newest, when a delete runs next to one).
    pub fn running_for(&self, instance: Uuid) -> Option<OpStatus> {
        let inner = self.lock();
        inner
            .by_instance
            .get(&instance)
            .and_then(|ids| ids.last())
            .and_then(|id| inner.running.get(id))
            .map(|r| r.op.clone())
    }

    /// Running operations (oldest first), then finished ones (newest first); `instance`
    /// filters.
    pub fn list(&self, instance: Option<Uuid>) -> Vec<OpStatus> {
        let inner = self.lock();
        let keep = |o: &&OpStatus| instance.is_none_or(|u| o.instance == u);
        let mut running: Vec<OpStatus> = inner
            .running
            .values()
            .map(|r| &r.op)
            .filter(keep)
            .cloned()
            .collect();
        running.sort_by_key(|o| o.started_ms);
        running.extend(inner.finished.iter().rev().filter(keep).cloned());
        running
    }

    /// Operations running now.
    pub fn running_count(&self) -> usize {
        self.lock().running.len()
    }

    /// True once [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// No new operations from now on (the service refuses them with 503).
    pub fn close(&self) {
        self.lock().closed = true;
    }

    /// Wait until nothing runs or `deadline` passes. True when nothing runs.
    pub async fn drain(&self, deadline: Instant) -> bool {
        let mut rx = self.running_tx.subscribe();
        let idle = async move { rx.wait_for(|n| *n == 0).await.is_ok() };
        matches!(tokio::time::timeout_at(deadline, idle).await, Ok(true))
    }

    /// Abort every running operation's task and record it as failed with `error`. Returns the
    /// operations aborted.
    pub fn abort_all(&self, error: &ErrorDetail) -> Vec<OpStatus> {
        let ids: Vec<Uuid> = {
            let inner = self.lock();
            for r in inner.running.values() {
                if let Some(a) = &r.abort {
                    a.abort();
                }
            }
            inner.running.keys().copied().collect()
        };
        ids.into_iter()
            .filter_map(|id| self.finish(id, Err(error.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;
    use vireo_actors::lifecycle::Request;

    fn err(code: &str) -> ErrorDetail {
        ErrorDetail {
            code: code.into(),
            message: code.into(),
        }
    }

    #[test]
    fn running_and_finished_operations_are_tracked_per_instance() {
        let ops = Operations::new(10);
        let a = Uuid::new_v4();
        let op = ops.record(a, OpKind::Create);
        let other = ops.record(Uuid::new_v4(), OpKind::Action(Request::Pause));
        assert_eq!(ops.running_count(), 2);
        assert_eq!(ops.running_for(a).unwrap().id, op.id);
        let done = ops.finish(op.id, Ok(json!({"steps": []}))).unwrap();
        assert_eq!(done.state, OpState::Succeeded);
        assert!(done.finished_ms.is_some());
        assert!(ops.running_for(a).is_none());
        assert!(
            ops.finish(op.id, Ok(json!(null))).is_none(),
            "finished twice"
        );
        assert_eq!(ops.get(other.id).unwrap().state, OpState::Running);
    }

    #[test]
    fn a_delete_next_to_a_running_operation_is_the_one_shown() {
        let ops = Operations::new(10);
        let a = Uuid::new_v4();
        let create = ops.record(a, OpKind::Create);
        let delete = ops.record(a, OpKind::Delete);
        assert_eq!(ops.running_for(a).unwrap().id, delete.id, "newest shown");
        ops.finish(create.id, Err(err("cancelled")));
        assert_eq!(ops.running_for(a).unwrap().id, delete.id);
        ops.finish(delete.id, Ok(json!(null)));
        assert!(ops.running_for(a).is_none());
    }

    #[test]
    fn finished_operations_are_bounded_oldest_first() {
        let ops = Operations::new(3);
        let ids: Vec<Uuid> = (0..5)
            .map(|_| {
                let op = ops.record(Uuid::new_v4(), OpKind::Delete);
                ops.finish(op.id, Err(err("failed")));
                op.id
            })
            .collect();
        assert!(ops.get(ids[0]).is_none());
        assert!(ops.get(ids[1]).is_none());
        for id in &ids[2..] {
            assert_eq!(ops.get(*id).unwrap().state, OpState::Failed);
        }
        let listed: Vec<Uuid> = ops.list(None).iter().map(|o| o.id).collect();
        assert_eq!(listed, [ids[4], ids[3], ids[2]], "newest first");
    }

    #[test]
    fn closing_is_remembered() {
        let ops = Operations::new(3);
        assert!(!ops.is_closed());
        ops.close();
        assert!(ops.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_answers_when_its_operation_finishes_or_at_the_deadline() {
        let ops = std::sync::Arc::new(Operations::new(3));
        let op = ops.record(Uuid::new_v4(), OpKind::Create);
        let other = ops.record(Uuid::new_v4(), OpKind::Create);
        let at_deadline = ops
            .wait_finished(op.id, Instant::now() + Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(
            at_deadline.state,
            OpState::Running,
            "still running at the deadline"
        );
        let o2 = ops.clone();
        let (id, other_id) = (op.id, other.id);
        tokio::spawn(async move {
            // Another operation's finish wakes the poll, which goes on waiting for its own.
            tokio::time::sleep(Duration::from_secs(1)).await;
            o2.finish(other_id, Ok(json!(null)));
            tokio::time::sleep(Duration::from_secs(1)).await;
            o2.finish(id, Err(err("failed")));
        });
        let start = Instant::now();
        let done = ops
            .wait_finished(op.id, start + Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(done.state, OpState::Failed);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(2),
            "answered at the finish"
        );
        assert!(ops
            .wait_finished(Uuid::new_v4(), Instant::now())
            .await
            .is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_the_last_operation_or_the_deadline() {
        let ops = std::sync::Arc::new(Operations::new(3));
        let op = ops.record(Uuid::new_v4(), OpKind::Create);
        assert!(
            !ops.drain(Instant::now() + Duration::from_secs(1)).await,
            "deadline"
        );
        let o2 = ops.clone();
        let id = op.id;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            o2.finish(id, Ok(json!(null)));
        });
        assert!(ops.drain(Instant::now() + Duration::from_secs(5)).await);
        assert!(ops.drain(Instant::now()).await, "nothing runs");
    }

    #[tokio::test]
    async fn abort_all_cancels_tasks_and_records_failures() {
        let ops = Operations::new(3);
        let op = ops.record(Uuid::new_v4(), OpKind::Action(Request::LiveMigrate));
        let task = tokio::spawn(std::future::pending::<()>());
        ops.attach(op.id, task.abort_handle());
        let aborted = ops.abort_all(&err("shutdown"));
        assert_eq!(aborted.len(), 1);
        assert!(task.await.unwrap_err().is_cancelled());
        let got = ops.get(op.id).unwrap();
        assert_eq!(got.state, OpState::Failed);
        assert_eq!(got.error.unwrap().code, "shutdown");
        assert_eq!(ops.running_count(), 0);
    }
}
