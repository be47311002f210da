use health_common::maps::{EchoConfig, EchoCounter};

use super::maps::{ECHO_CONFIG, ECHO_STATS};

/// Adds one to this CPU's slot of `counter`.
#[inline(always)]
pub fn count(counter: EchoCounter) {
    if let Some(slot) = ECHO_STATS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, only this program on this CPU writes it.
        unsafe { *slot += 1 };
    }
}

/// The configured endpoint address (all zeroes when none is set).
#[inline(always)]
pub fn endpoint_addr() -> [u8; 4] {
    ECHO_CONFIG
        .get(0)
        .map_or([0; 4], |EchoConfig { addr }| *addr)
}
