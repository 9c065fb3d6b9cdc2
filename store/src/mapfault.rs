//! Memory maps of files (the LMDB ledger, the run's copy of the task file) turn a damaged or
//! truncated file into SIGBUS or SIGSEGV at the first read past its end, with no message. Maps
//! registered here get a handler that names the file and exits with htc's error status instead;
//! faults anywhere else go on to the handler that was there before (Rust's stack-overflow report,
//! or the default action).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

use nix::sys::signal::{sigaction, signal, SaFlags, SigAction, SigHandler, SigSet, Signal};

const SLOTS: usize = 16;

struct Slot {
    /// Also blamed for a null-pointer fault (see `register_blaming_nulls`).
    nulls: AtomicBool,
    base: AtomicUsize,
    len: AtomicUsize,
    msg: AtomicPtr<u8>,
    msg_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // the initialiser of the array below
const EMPTY: Slot = Slot {
    nulls: AtomicBool::new(false),
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    msg: AtomicPtr::new(std::ptr::null_mut()),
    msg_len: AtomicUsize::new(0),
};
static MAPS: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
static mut PREVIOUS: [Option<SigAction>; 2] = [None, None];

/// A registered map; dropping it unregisters (before the map itself goes away).
pub struct Registration(usize);

/// Registers `[base, base + len)`, whose faults print `htc: {what}` and exit with status 2.
/// Returns None when every slot is taken (the map then just lacks the message).
pub fn register(base: usize, len: usize, what: &str) -> Option<Registration> {
    register_as(base, len, what, false)
}

/// As `register`, and a fault at a null pointer anywhere is blamed on this map too: C code that
/// reads the map (LMDB) follows what a damaged page says, and a broken node can send it through
/// a null pointer. Rust code never faults there, and a stack overflow faults far from it.
pub fn register_blaming_nulls(base: usize, len: usize, what: &str) -> Option<Registration> {
    register_as(base, len, what, true)
}

/// Faults below this address are null-pointer dereferences (plus a field offset).
const NULL_PAGE: usize = 64 << 10;

fn register_as(base: usize, len: usize, what: &str, nulls: bool) -> Option<Registration> {
    INSTALL.call_once(install);
    let msg: &'static mut [u8] = format!("htc: {what}\n").into_bytes().leak();
    for (i, s) in MAPS.iter().enumerate() {
        if s.base.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            s.msg.store(msg.as_mut_ptr(), Ordering::Release);
            s.msg_len.store(msg.len(), Ordering::Release);
            s.len.store(len, Ordering::Release);
            s.nulls.store(nulls, Ordering::Release);
            s.base.store(base, Ordering::Release);
            return Some(Registration(i));
        }
    }
    None
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = &MAPS[self.0];
        s.len.store(0, Ordering::Release);
        s.nulls.store(false, Ordering::Release);
        s.base.store(0, Ordering::Release);
        // The message stays allocated: a handler running right now on another thread may read it.
    }
}

/// The base address of the largest map of `path` in this process (LMDB does not say where it
/// mapped its file, so /proc/self/maps does).
pub fn find_map(path: &std::path::Path) -> Option<(usize, usize)> {
    let path = std::fs::canonicalize(path).ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let want = path.to_str()?;
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(want))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
            Some((a, b.checked_sub(a)?))
        })
        .max_by_key(|&(_, len)| len)
}

fn install() {
    // SA_SIGINFO comes with the SigAction handler.
    let new =
        SigAction::new(SigHandler::SigAction(on_fault), SaFlags::SA_ONSTACK | SaFlags::SA_NODEFER, SigSet::empty());
    for (i, sig) in [Signal::SIGBUS, Signal::SIGSEGV].into_iter().enumerate() {
        // SAFETY: on_fault only reads atomics and makes async-signal-safe calls. PREVIOUS is
        // written only here, once (INSTALL), before any map is registered (register_as waits for
        // INSTALL): the handler reads it only for a fault outside the maps, so only an unrelated
        // crash on another thread in this instant could race the write.
        unsafe {
            if let Ok(old) = sigaction(sig, &new) {
                PREVIOUS[i] = Some(old);
            }
        }
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &MAPS {
        let base = s.base.load(Ordering::Acquire);
        if base == 0 || base == usize::MAX {
            continue;
        }
        let inside = addr >= base && addr - base < s.len.load(Ordering::Acquire);
        let null = sig == libc::SIGSEGV && addr < NULL_PAGE && s.nulls.load(Ordering::Acquire);
        if !inside && !null {
            continue;
        }
        let (msg, len) = (s.msg.load(Ordering::Acquire), s.msg_len.load(Ordering::Acquire));
        // SAFETY: write(2) and _exit(2) are async-signal-safe; msg is leaked (never freed, even
        // when its slot is released) and msg_len its length, published before `base`.
        unsafe {
            libc::write(2, msg.cast(), len);
            libc::_exit(2);
        }
    }
    // Not ours: put the previous action back and return, so the fault recurs and gets it.
    let (i, sig) = if sig == libc::SIGBUS { (0, Signal::SIGBUS) } else { (1, Signal::SIGSEGV) };
    // SAFETY: PREVIOUS is not written after install() (see there) and is read by value;
    // sigaction and signal are async-signal-safe, and so are nix's wrappers (no allocation).
    unsafe {
        let _ = match (*std::ptr::addr_of!(PREVIOUS))[i] {
            Some(old) => sigaction(sig, &old).map(drop),
            None => signal(sig, SigHandler::SigDfl).map(drop),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_of_a_file_is_found_and_registrations_are_released() {
        let path = std::env::temp_dir().join(format!("htc-mapfault-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
        let len = std::num::NonZeroUsize::new(8192).unwrap();
        // SAFETY: a new read-only private map (the kernel picks where) of a file we own, unmapped
        // below.
        let map = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_PRIVATE, &f, 0) }.unwrap();
        let p = map.as_ptr() as usize;
        assert_eq!(find_map(&path), Some((p, 8192)));
        let regs: Vec<_> = (0..SLOTS).map_while(|_| register(p, 8192, "x")).collect();
        assert!(!regs.is_empty());
        drop(regs);
        assert!(register(p, 8192, "x").is_some(), "slots come back when dropped");
        // SAFETY: the mapping made above, not used after.
        unsafe { munmap(map, 8192) }.unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
