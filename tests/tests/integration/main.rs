//! The root-only integration tests, in one binary (one link of aya, axum
//! and hyper instead of one per file): a module per area. Each test builds
//! its own namespaces, veths and bpffs directories with unique names
//! (`health_tests::names`) and removes them on drop, panics included.

#![allow(
    unused_crate_dependencies,
    reason = "a test target sees every dependency of the package; most serve its fixtures"
)]

mod alerts;
mod attach;
mod chaos;
mod cluster;
mod cluster6;
mod cluster_elect;
mod cluster_view;
mod config;
mod ct6_netns;
mod datapath;
mod echo6_netns;
mod echo6_test_run;
mod echo_netns;
mod echo_test_run;
mod encrypt_test_run;
mod encryption;
mod endpoint;
mod endpoint6;
mod endpoint_owned;
mod etcd;
mod etcd_members;
mod faults;
mod flows;
mod hello_flood;
mod lab;
mod maps;
mod masquerade;
mod metrics;
mod nat6_test_run;
mod nat_test_run;
mod package;
mod page;
mod peer_routes;
mod probe6;
mod quality;
mod scale;
mod service;
mod trace;
mod track6_test_run;
mod track_test_run;
mod trust;
mod tunnel_routes;
