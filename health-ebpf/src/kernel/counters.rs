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

/// The responder's configuration, in place in its map (too large to copy
/// onto the BPF stack). An array's slot 0 always exists; an unset one is
/// all zeroes, "answer nothing".
#[inline(always)]
pub fn echo_config() -> Option<&'static EchoConfig> {
    ECHO_CONFIG.get(0)
}
