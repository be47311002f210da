//! Writing const series from a collector: a gauge or counter, alone or as
//! a family over label sets.

use std::fmt::Error;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// A gauge without labels.
pub(super) fn gauge<V: EncodeGaugeValue + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: V,
) -> Result<(), Error> {
    let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(m)
}

/// A counter without labels (`name` without `_total`).
pub(super) fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), Error> {
    let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(value).encode(m)
}

/// A gauge family: one series per label set.
pub(super) fn gauges<S, V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (S, V)>,
) -> Result<(), Error>
where
    S: EncodeLabelSet,
    V: EncodeGaugeValue + std::fmt::Debug,
{
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter family: one series per label set (`name` without `_total`).
pub(super) fn counters<S: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (S, u64)>,
) -> Result<(), Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}
