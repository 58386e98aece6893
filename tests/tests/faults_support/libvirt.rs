//! Libvirt faults' hold: a connection whose workers are all busy, so an operation's next
//! libvirt call queues.

use std::sync::Arc;
use std::time::Duration;

use vireo_actors::libvirt::LibvirtHandle;

use super::super::common::eventually;

/// Every libvirt worker of a connection busy with a call that waits for the test: the next
/// call an operation makes queues behind them (the operation is held there).
#[derive(Debug)]
pub struct LibvirtHold {
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LibvirtHold {
    /// Occupy every worker of `lv`; returns once all of them are held.
    pub async fn start(lv: &LibvirtHandle) -> LibvirtHold {
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers = lv.config().workers;
        let mut tasks = Vec::new();
        for _ in 0..workers {
            let (lv, gate, entered) = (lv.clone(), gate.clone(), entered.clone());
            tasks.push(tokio::spawn(async move {
                let _ = lv
                    .call_with_timeout("test hold", Duration::from_secs(120), move |_conn| {
                        entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let (lock, cv) = &*gate;
                        let mut released = lock.lock().unwrap();
                        while !*released {
                            released = cv.wait(released).unwrap();
                        }
                        Ok(())
                    })
                    .await;
            }));
        }
        eventually(Duration::from_secs(10), "every libvirt worker held", || {
            let n = entered.load(std::sync::atomic::Ordering::SeqCst);
            async move { (n == workers).then_some(()) }
        })
        .await;
        LibvirtHold { gate, tasks }
    }

    /// Let the workers go; returns once they are free.
    pub async fn release(mut self) {
        self.open();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }

    fn open(&self) {
        let (lock, cv) = &*self.gate;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
}

impl Drop for LibvirtHold {
    fn drop(&mut self) {
        self.open();
    }
}
