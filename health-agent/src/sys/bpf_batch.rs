//! Batched reads, writes and deletes of BPF hash maps
//! (`BPF_MAP_LOOKUP_BATCH`, `BPF_MAP_UPDATE_BATCH`, `BPF_MAP_DELETE_BATCH`,
//! Linux 5.6), which aya does not wrap: walking a
//! map of N entries one key at a time costs 2N syscalls (the next key, then
//! its value), 120,000 a pass over the CT map at 5,000 peers; in batches
//! it costs N / [`CHUNK`].

use std::{
    io,
    mem::{MaybeUninit, size_of},
    os::fd::{AsRawFd as _, BorrowedFd},
};

/// Entries asked for per syscall.
pub const CHUNK: usize = 4096;

/// Bytes of keys and values a lookup batch asks for at most: the buffers
/// live only through a walk, but their pages count in the agent's RSS
/// meanwhile (4,096 entries of 512 bytes are 2 MB).
const BATCH_BYTES: usize = 256 * 1024;

/// Entries a lookup batch asks for when an entry takes `bytes` of the
/// buffers: [`CHUNK`], fewer when they would pass [`BATCH_BYTES`].
fn lookup_chunk(bytes: usize) -> usize {
    (BATCH_BYTES / bytes.max(1)).clamp(64, CHUNK)
}

/// `enum bpf_cmd` of `<linux/bpf.h>`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// The `batch` member of `union bpf_attr`: the kernel reads the first
/// `size_of::<BatchAttr>()` bytes and takes the rest as zero.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The `bpf(2)` syscall with `attr`; the error is `errno`'s.
fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid, initialised `bpf_attr` prefix of the size
    // given; the pointers in it point to buffers the caller keeps alive
    // and sized for `count` entries.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            size_of::<BatchAttr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn fd_of(map: BorrowedFd<'_>) -> u32 {
    u32::try_from(map.as_raw_fd()).unwrap_or(u32::MAX)
}

/// Calls `each` with every entry of the hash map `map` (keys `K`, values
/// `V`, of the map's key and value sizes: the caller's types must match the
/// map's, as aya checks for its own maps). Entries added or removed during
/// the walk may or may not be seen, as with a walk by keys.
pub fn for_each<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    each: impl FnMut(&K, &V),
) -> io::Result<()> {
    for_each_slice(map, Cursor::START, usize::MAX, each).map(drop)
}

/// Where a walk of a hash map stands between slices: the kernel's batch
/// token (a bucket number), or the map's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor(Option<u64>);

impl Cursor {
    /// The start of the map.
    pub const START: Self = Self(None);
}

/// [`for_each`] over a slice of the map: from `from`, at least `budget`
/// entries (whole buckets: a few more) or up to the map's end. Returns where
/// the next slice starts, or `None` when this slice reached the end. A walk
/// in slices sees the entries a walk in one go would, except those added
/// or removed meanwhile, which it may or may not see.
pub fn for_each_slice<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    from: Cursor,
    budget: usize,
    mut each: impl FnMut(&K, &V),
) -> io::Result<Option<Cursor>> {
    lookup_batches::<K, V>(map, 1, 1, from, budget, |keys, values| {
        for (k, v) in keys.iter().zip(values) {
            // SAFETY: the kernel wrote these keys and their values, and any
            // bytes are a valid `Pod`.
            let (k, v) = unsafe { (k.assume_init_ref(), v.assume_init_ref()) };
            each(k, v);
        }
    })
}

/// How many entries the hash map `map` holds (keys of `key_size` bytes,
/// values of `value_size`: for a per-CPU map, each CPU's value rounded up
/// to 8 bytes, times the possible CPUs), counted in batches.
pub fn count(map: BorrowedFd<'_>, key_size: usize, value_size: usize) -> io::Result<u64> {
    let mut total = 0u64;
    lookup_batches::<u8, u8>(
        map,
        key_size.max(1),
        value_size.max(1),
        Cursor::START,
        usize::MAX,
        |keys, _| total += (keys.len() / key_size.max(1)) as u64,
    )?;
    Ok(total)
}

/// `BPF_MAP_LOOKUP_BATCH` from `from` until at least `budget` entries
/// were read (then returns where to go on) or the map's end (`None`): each
/// key takes `key_units` of `K` and `value_units` of `V` in the buffers;
/// `got` sees the keys and values each call filled.
fn lookup_batches<K, V>(
    map: BorrowedFd<'_>,
    key_units: usize,
    value_units: usize,
    from: Cursor,
    budget: usize,
    mut got: impl FnMut(&[MaybeUninit<K>], &[MaybeUninit<V>]),
) -> io::Result<Option<Cursor>> {
    let mut chunk = lookup_chunk(key_units * size_of::<K>() + value_units * size_of::<V>());
    let mut keys: Vec<MaybeUninit<K>> = Vec::new();
    let mut values: Vec<MaybeUninit<V>> = Vec::new();
    // The batch token: a bucket number for hash maps (4 bytes), written
    // back by the kernel; 8 bytes leave room.
    let (mut token_in, mut token_out) = (from.0.unwrap_or(0), 0u64);
    let mut first = from.0.is_none();
    let mut read = 0usize;
    // The least a call asks for: raised when a bucket holds more.
    let mut floor = 1usize;
    loop {
        // No more than the slice has left to read (whole buckets: a few
        // more when the last bucket holds several).
        let ask = chunk.min(budget.saturating_sub(read)).max(floor);
        keys.resize_with(ask * key_units, MaybeUninit::uninit);
        values.resize_with(ask * value_units, MaybeUninit::uninit);
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_ref(&token_in) as u64
            },
            out_batch: std::ptr::from_mut(&mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(ask).unwrap_or(u32::MAX),
            map_fd: fd_of(map),
            ..BatchAttr::default()
        };
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let filled = (attr.count as usize).min(ask);
        got(&keys[..filled * key_units], &values[..filled * value_units]);
        read = read.saturating_add(filled);
        match result {
            Ok(()) => {}
            // The end of the map (with the last entries above).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            // A bucket holds more entries than asked for: ask for more.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && filled == 0 => {
                floor = ask * 2;
                chunk = chunk.max(floor);
                continue;
            }
            Err(e) => return Err(e),
        }
        token_in = token_out;
        first = false;
        if read >= budget {
            return Ok(Some(Cursor(Some(token_in))));
        }
    }
}

/// Deletes `keys` from the hash map `map` in batches; keys already gone
/// (expired, or deleted by someone else meanwhile) are passed over.
/// `deleted` is called with each key that this call deleted.
pub fn delete<K: aya::Pod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    mut deleted: impl FnMut(&K),
) -> io::Result<()> {
    let mut rest = keys;
    while !rest.is_empty() {
        let n = rest.len().min(CHUNK);
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: u32::try_from(n).unwrap_or(u32::MAX),
            map_fd: fd_of(map),
            ..BatchAttr::default()
        };
        let result = bpf(BPF_MAP_DELETE_BATCH, &mut attr);
        // The kernel deletes in order and stops at the first key it cannot.
        let done = (attr.count as usize).min(n);
        rest[..done].iter().for_each(&mut deleted);
        let skip = match result {
            Ok(()) => done,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => done + 1,
            Err(e) => return Err(e),
        };
        rest = &rest[skip.min(rest.len())..];
    }
    Ok(())
}

/// Writes `keys[i]` = `values[i]` (created or replaced) into the hash map
/// `map` in batches. The slices are as long as each other.
pub fn update<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> io::Result<()> {
    if keys.len() != values.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} keys for {} values", keys.len(), values.len()),
        ));
    }
    for (k, v) in keys.chunks(CHUNK).zip(values.chunks(CHUNK)) {
        let mut attr = BatchAttr {
            keys: k.as_ptr() as u64,
            values: v.as_ptr() as u64,
            count: u32::try_from(k.len()).unwrap_or(u32::MAX),
            map_fd: fd_of(map),
            ..BatchAttr::default()
        };
        bpf(BPF_MAP_UPDATE_BATCH, &mut attr)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_batches_stay_within_their_byte_budget() {
        // A CT entry (keys and values of tens of bytes): the full chunk.
        assert_eq!(lookup_chunk(56), CHUNK);
        // A 240-byte value on each of 2 CPUs with its key: fewer.
        let n = lookup_chunk(480 + 40);
        assert!(n * 520 <= BATCH_BYTES && n < CHUNK, "{n}");
        // Never below 64, however large the value.
        assert_eq!(lookup_chunk(1 << 20), 64);
        assert_eq!(lookup_chunk(0), CHUNK);
    }
}
