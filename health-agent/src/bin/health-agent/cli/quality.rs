//! `health-agent status --quality NODE`: a node's paths over the sliding
//! windows, one line a window.

use std::{fmt::Write as _, time::Duration};

use health_agent::{
    probe::{
        flows::PathFlows,
        path::ProbeResult,
        quality::Quality,
        quality_view::{NodeQuality, PathQualityView},
    },
    util::timefmt::short,
};

fn rtt(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".to_owned(), |ns| short(Duration::from_nanos(ns)))
}

fn percent(r: f64) -> String {
    format!("{:.2}%", r * 100.0)
}

/// A window's loss: `2.10% [1.20%, 3.60%]`, or `-` without probes.
fn loss(q: &Quality) -> String {
    match (q.loss_ratio, q.loss_low, q.loss_high) {
        (Some(r), Some(l), Some(h)) => format!("{} [{}, {}]", percent(r), percent(l), percent(h)),
        _ => "-".to_owned(),
    }
}

fn verdict(p: &PathQualityView) -> String {
    let v = match (p.result, p.degraded) {
        (ProbeResult::Success, true) => "degraded",
        (ProbeResult::Success, false) => "ok",
        (ProbeResult::Failure, _) => "failure",
        (ProbeResult::Unknown, _) => "unknown",
    };
    let v = match p.mtu_blackhole {
        Some(bytes) => format!("{v}, mtu-blackhole ({bytes}-byte probes lost)"),
        None => v.to_owned(),
    };
    match p.flows.as_deref().and_then(PathFlows::partial_line) {
        Some(partial) => format!("{v}, {partial}"),
        None => v,
    }
}

/// Each flow's loss over its window, a line: `flow 0 (source 51234)
/// lost 0 of 64`.
fn flow_lines(out: &mut String, flows: &PathFlows) {
    let _ = writeln!(
        out,
        "    {:<6} {:>7} {:>7} {:>7}",
        "FLOW", "SOURCE", "PROBES", "LOST"
    );
    for f in &flows.flows {
        let _ = writeln!(
            out,
            "    {:<6} {:>7} {:>7} {:>7}{}",
            f.flow,
            f.source,
            f.probes,
            f.lost,
            if f.failing { "  failing" } else { "" }
        );
    }
}

/// The table of `q`.
#[must_use]
pub(crate) fn render(q: &NodeQuality) -> String {
    let mut out = format!(
        "Path quality of {} (degraded: loses at least {} of its probes, 95 % confidence)\n",
        q.node,
        percent(q.degraded_loss)
    );
    for p in &q.paths {
        let _ = writeln!(
            out,
            "\n  {} ({}) to {}: {}",
            p.path,
            p.family,
            p.ip,
            verdict(p)
        );
        let _ = writeln!(
            out,
            "    {:<6} {:>7} {:>7}  {:<28} {:>9} {:>9} {:>9} {:>9}",
            "WINDOW", "PROBES", "LOST", "LOSS [95% CI]", "P50", "P90", "P99", "P99.9"
        );
        for w in &p.windows {
            let _ = writeln!(
                out,
                "    {:<6} {:>7} {:>7}  {:<28} {:>9} {:>9} {:>9} {:>9}",
                w.window,
                w.probes,
                w.lost,
                loss(w),
                rtt(w.rtt_p50_ns),
                rtt(w.rtt_p90_ns),
                rtt(w.rtt_p99_ns),
                rtt(w.rtt_p999_ns)
            );
        }
        if let Some(flows) = &p.flows {
            flow_lines(&mut out, flows);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use health_agent::probe::{family::Family, quality::PathQuality};

    use super::*;

    #[test]
    fn each_window_shows_its_loss_interval_and_only_the_percentiles_it_has() {
        let mut pq = PathQuality::default();
        let t0 = 10_000_000;
        for i in 0..200u64 {
            pq.record(t0 + i * 1000, (i % 20 != 0).then_some(150_000));
        }
        let q = NodeQuality {
            node: "node-7".into(),
            degraded_loss: 0.01,
            paths: vec![PathQualityView {
                path: "host-icmp".into(),
                family: Family::Ipv4,
                ip: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 7)),
                result: ProbeResult::Success,
                degraded: true,
                mtu_blackhole: None,
                flows: None,
                windows: pq.windows(t0 + 200 * 1000),
            }],
        };
        let text = render(&q);
        assert!(
            text.contains("host-icmp (ipv4) to 198.18.0.7: degraded"),
            "{text}"
        );
        let ten = text
            .lines()
            .find(|l| l.trim_start().starts_with("10m"))
            .expect("a 10m line");
        assert!(ten.contains(" 200 ") && ten.contains(" 10 "), "{ten}");
        assert!(ten.contains("5.00% ["), "{ten}");
        // 190 answered: p50, p90 and p99 shown, p99.9 not.
        assert_eq!(ten.matches('-').count(), 1, "{ten}");
        assert!(text.contains("at least 1.00% of its probes"), "{text}");
    }
}
