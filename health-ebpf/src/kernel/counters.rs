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

/// The responder's configuration (all zeroes, "answer nothing", when none
/// is set).
#[inline(always)]
pub fn echo_config() -> EchoConfig {
    ECHO_CONFIG.get(0).copied().unwrap_or_default()
}
