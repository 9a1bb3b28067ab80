//! The copy engine of the memory simulator.

use super::*;

/// The copy engine: one transfer at a time, soonest-needed layer first (then request order),
/// preemptive. Every request is made at the engine's current time.
#[derive(Default)]
pub(super) struct CopyQueue {
    pub(super) now: f64,
    pub(super) jobs: Vec<Job>,
    /// (needed at (step, layer), request number) of the pending jobs; the request number is the id
    pub(super) pending: BTreeSet<((usize, usize), usize)>,
}

pub(super) struct Job {
    /// (step, layer) that uses the expert
    pub(super) need: (usize, usize),
    pub(super) duration: f64,
    pub(super) served: f64,
    pub(super) done: bool,
    pub(super) cancelled: bool,
    /// requested by the layer that found the expert missing (not by a prediction)
    pub(super) demand: bool,
}

impl CopyQueue {
    /// Request a transfer needed by (step, layer) `need` at time `at`; returns its id.
    pub(super) fn push(
        &mut self,
        at: f64,
        need: (usize, usize),
        duration: f64,
        demand: bool,
    ) -> usize {
        self.run_until(at);
        let id = self.jobs.len();
        self.jobs.push(Job {
            need,
            duration,
            served: 0.0,
            done: false,
            cancelled: false,
            demand,
        });
        self.pending.insert((need, id));
        id
    }

    /// Serve pending transfers until time `t`.
    pub(super) fn run_until(&mut self, t: f64) {
        while self.now < t {
            let Some(&(_, id)) = self.pending.first() else {
                self.now = t;
                return;
            };
            self.serve(id, Some(t));
        }
    }

    /// Serve job `id` until done or until time `limit`.
    pub(super) fn serve(&mut self, id: usize, limit: Option<f64>) {
        let job = &mut self.jobs[id];
        let left = job.duration - job.served;
        match limit {
            Some(t) if t - self.now < left => {
                job.served += t - self.now;
                self.now = t;
            }
            _ => {
                job.served = job.duration;
                job.done = true;
                self.now += left;
                self.pending.remove(&(job.need, id));
            }
        }
    }

    /// Serve (soonest first) until every job in `ids` is done; returns the time then.
    pub(super) fn finish(&mut self, ids: &[usize]) -> f64 {
        while ids.iter().any(|&id| !self.jobs[id].done) {
            let &(_, id) = self.pending.first().expect("an unfinished job is pending");
            self.serve(id, None);
        }
        self.now
    }

    pub(super) fn is_done(&self, id: usize) -> bool {
        self.jobs[id].done
    }

    /// Stop job `id` if it is still copying; returns the fraction of it copied.
    pub(super) fn cancel(&mut self, id: usize) -> f64 {
        let job = &mut self.jobs[id];
        if !job.done && !job.cancelled {
            job.cancelled = true;
            self.pending.remove(&(job.need, id));
        }
        job.served / job.duration
    }
}
