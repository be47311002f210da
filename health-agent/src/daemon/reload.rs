//! SIGHUP: the configuration is re-read (by the caller's [`Reload`], which
//! knows where it came from) and the settings that can change at run time
//! are applied. The prober's settings (interval, timeout, thresholds) are
//! fixed for a prober's life, so a change makes a new prober with the same
//! node set, which takes over every path's counters, results and history
//! from the old one and replaces it at once in the API, the node sync and
//! the probe loop: the round under way is dropped (its probes' tasks
//! aborted; a path trace it started runs to its end), and the new
//! prober's first round starts one interval later. The probe
//! timeout also goes to the datapath's RTT loss sweep (on its own
//! channel), which counts losses with it from its next pass; a shortened
//! one, once the longer one has stopped counting ([`LossTimeout`]).

use std::{sync::Arc, time::Instant};

use sd_notify::NotifyState;
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub use crate::config::ProbeTuning;
use crate::{datapath::collect::LossTimeout, probe::Prober, sys::signals::Hangups};

/// Called on SIGHUP: re-reads the configuration, applies what it owns
/// itself (the log level), reports what needs a restart, and returns the
/// probe settings to run with from now on (`None`: keep the running ones,
/// e.g. when the new configuration is refused).
pub type Reload = Box<dyn FnMut() -> Option<ProbeTuning> + Send>;

/// Sends `states` to the service manager (nothing when not started by one).
pub(super) fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!("notifying the service manager: {e}");
    }
}

/// Where applied settings go: the prober in service, and the probe
/// timeout's other consumers (the RTT loss sweep).
#[derive(Debug, Clone)]
pub(super) struct Targets {
    pub(super) probers: watch::Sender<Arc<Prober>>,
    pub(super) probe_timeout: watch::Sender<LossTimeout>,
}

/// Answers SIGHUPs until the task is dropped.
pub(super) async fn run(mut hangups: Hangups, mut reload: Option<Reload>, targets: Targets) {
    while hangups.recv().await {
        let Some(reload) = reload.as_mut() else {
            info!("SIGHUP: no configuration file, nothing to re-read");
            continue;
        };
        info!("SIGHUP: re-reading the configuration");
        let mut reloading = vec![NotifyState::Reloading];
        reloading.extend(NotifyState::monotonic_usec_now().ok());
        notify(&reloading);
        if let Some(tuning) = reload() {
            apply(tuning, &targets);
        }
        notify(&[NotifyState::Ready]);
    }
}

fn apply(tuning: ProbeTuning, targets: &Targets) {
    let old = targets.probers.borrow().clone();
    let mut cfg = old.config().clone();
    if cfg.is_tuned_as(&tuning) {
        debug!("probe settings unchanged");
        return;
    }
    cfg.retune(&tuning);
    let new = Prober::new(cfg);
    // Every path keeps its counters and last result: only the settings
    // change.
    new.take_over(&old);
    targets.probers.send_replace(new);
    targets
        .probe_timeout
        .send_if_modified(|t| t.reload(tuning.probe_timeout, Instant::now()));
    info!(
        interval = ?tuning.probe_interval,
        timeout = ?tuning.probe_timeout,
        success_threshold = tuning.success_threshold,
        failure_threshold = tuning.failure_threshold,
        history_length = tuning.history_length,
        "probe settings applied"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeConfig;

    fn tuning(cfg: &ProbeConfig) -> ProbeTuning {
        ProbeTuning {
            probe_interval: cfg.interval,
            liveness_interval: cfg.liveness.unwrap_or_default(),
            probe_timeout: cfg.timeout,
            success_threshold: cfg.thresholds.success,
            failure_threshold: cfg.thresholds.failure,
            history_length: u16::try_from(cfg.history_length).expect("a history length"),
        }
    }

    #[test]
    fn a_new_probe_timeout_reaches_the_prober_and_the_loss_sweep() {
        let cfg = ProbeConfig::default();
        let (probers, prober) = watch::channel(Prober::new(cfg.clone()));
        let (probe_timeout, mut sweep) = watch::channel(LossTimeout::new(cfg.timeout));
        let targets = Targets {
            probers,
            probe_timeout,
        };
        // Unchanged settings: nothing is sent.
        apply(tuning(&cfg), &targets);
        assert!(!sweep.has_changed().expect("open"));
        let mut longer = tuning(&cfg);
        longer.probe_timeout = cfg.timeout * 3;
        apply(longer, &targets);
        assert_eq!(prober.borrow().config().timeout, cfg.timeout * 3);
        assert!(sweep.has_changed().expect("open"));
        assert_eq!(sweep.borrow_and_update().in_force(), cfg.timeout * 3);
        // Another setting alone: the sweep is not woken.
        let mut slower = longer;
        slower.probe_interval = cfg.interval * 2;
        apply(slower, &targets);
        assert_eq!(prober.borrow().config().interval, cfg.interval * 2);
        assert!(!sweep.has_changed().expect("open"));
        // Shorter again: in force at once, the longer one still counting.
        let mut shorter = slower;
        shorter.probe_timeout = cfg.timeout;
        apply(shorter, &targets);
        let now = Instant::now();
        let loss = *sweep.borrow_and_update();
        assert_eq!(loss.in_force(), cfg.timeout);
        assert_eq!(loss.at(now), cfg.timeout * 3);
    }
}
