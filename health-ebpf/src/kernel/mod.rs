//! Programs, maps and the packet view they share.
#![allow(
    clippy::needless_pass_by_value,
    reason = "aya's program macros require entry points to take their context by value"
)]
#![allow(
    unreachable_pub,
    reason = "programs and maps are reached by the loader through their exported symbols, and the rest of this private tree is what they share"
)]

mod counters;
mod echo_tc;
mod echo_xdp;
mod encrypt;
mod maps;
mod nat;
mod packet;
mod track;

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
