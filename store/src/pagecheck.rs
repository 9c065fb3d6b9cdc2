//! A check of the ledger file's page structure, read straight from the file rather than through
//! LMDB, which trusts every page it follows. The checksums on values catch damage to what a value
//! says; they cannot catch a damaged page pointer or node offset that leads to an intact value
//! somewhere else in the file (an older copy of a page, freed but not yet reused), which would
//! read back whole and stale. So every page reachable from the newest meta page is walked: its
//! number and kind, its node offsets inside its free-space bounds, its keys in order, each page
//! reached once and none from the free list.
//!
//! The layout is LMDB 0.9's (lmdb.h/mdb.c): a 16-byte page header `pgno u64, pad u16, flags u16,
//! lower u16, upper u16`; node offsets from byte 16; a node `lo u16, hi u16, flags u16, ksize u16,
//! key, data`; in the meta record, the free and main databases' `MDB_db` at 24 and 72, each with
//! its root page at byte 40.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;

const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_META: u16 = 0x08;
/// Node flags: the value lives on overflow pages; the value is a named database's `MDB_db`.
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
const HEADER: usize = 16;
const NODE: usize = 8;
const P_INVALID: u64 = u64::MAX;
const MAGIC: u32 = 0xBEEF_C0DE;

/// What the walk saw.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pages {
    pub branch: u64,
    pub leaf: u64,
    pub overflow: u64,
}

/// Walks every page of the trees reachable from a meta page of the ledger file at `path` (the
/// one of commit `txn` if there is one, else the newest), or only the named databases' in `only`
/// (and the main tree and free list around them), reading only the pages it walks. The first
/// damage found, described. Beside a running leader, call it inside a read transaction of commit
/// `txn`: LMDB then reuses none of the pages walked.
pub fn check_file(path: &std::path::Path, only: Option<&[&str]>, txn: Option<u64>) -> Result<Pages, String> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    check(&|at: u64, buf: &mut [u8]| f.read_exact_at(buf, at).is_ok(), only, txn)
}

/// Reads `buf.len()` bytes at an offset of the ledger file; false past its end.
type Read<'r> = dyn Fn(u64, &mut [u8]) -> bool + 'r;

/// `check_file` over any reader of the file's bytes.
pub fn check(read: &Read<'_>, only: Option<&[&str]>, txn: Option<u64>) -> Result<Pages, String> {
    let mut b4 = [0u8; 4];
    let psize = read(HEADER as u64 + 24, &mut b4)
        .then(|| u32::from_le_bytes(b4))
        .filter(|p| p.is_power_of_two() && *p >= 512)
        .ok_or("no page size")? as usize;
    let meta = |at: u64| {
        let mut m = vec![0u8; psize];
        let u64_at = |m: &[u8], i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap());
        let magic = |m: &[u8]| u32::from_le_bytes(m[HEADER..HEADER + 4].try_into().unwrap());
        (read(at, &mut m) && magic(&m) == MAGIC).then(|| (u64_at(&m, HEADER + 128), u64_at(&m, HEADER + 120), m))
    };
    let metas: Vec<_> = [meta(0), meta(psize as u64)].into_iter().flatten().collect();
    let chosen = metas.iter().position(|m| Some(m.0) == txn);
    let newest = metas.iter().enumerate().max_by_key(|(_, m)| m.0).map(|(i, _)| i);
    let (_, last, m) = chosen.or(newest).map(|i| &metas[i]).ok_or("no meta page")?;
    let last = *last;
    let root_of = |db: &[u8]| u64::from_le_bytes(db[40..48].try_into().unwrap());
    let mut w = Walk {
        read,
        integer_keys: true,
        psize,
        last,
        seen: HashSet::new(),
        pages: Pages::default(),
        free: HashSet::new(),
    };
    // The free list first: pages on it must not be reachable from any tree.
    let free_root = root_of(&m[HEADER + 24..HEADER + 72]);
    let mut free_pages = Vec::new();
    w.tree(free_root, "the free list", &mut |_, data| {
        free_pages.extend(data.chunks_exact(8).skip(1).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
        Ok(())
    })?;
    w.free = free_pages.into_iter().collect();
    w.integer_keys = false;
    if let Some(p) = w.seen.iter().find(|p| w.free.contains(p)) {
        return Err(format!("page {p} is both in the free list's tree and on the free list"));
    }
    let main_root = root_of(&m[HEADER + 72..HEADER + 120]);
    let mut named = Vec::new();
    w.tree(main_root, "the main tree", &mut |key, data| {
        if data.len() != 48 {
            return Err(format!("the entry of database {:?} has {} bytes", String::from_utf8_lossy(key), data.len()));
        }
        named.push((String::from_utf8_lossy(key).into_owned(), root_of(data)));
        Ok(())
    })?;
    for (name, root) in named {
        if only.is_none_or(|o| o.contains(&name.as_str())) {
            w.tree(root, &format!("database '{name}'"), &mut |_, _| Ok(()))?;
        }
    }
    Ok(w.pages)
}

struct Walk<'f> {
    read: &'f Read<'f>,
    /// The tree walked has integer keys (the free list's: transaction ids, native-endian).
    integer_keys: bool,
    psize: usize,
    last: u64,
    seen: HashSet<u64>,
    free: HashSet<u64>,
    pages: Pages,
}

type Visit<'v> = dyn FnMut(&[u8], &[u8]) -> Result<(), String> + 'v;

impl Walk<'_> {
    /// Walks the tree at `root`, handing each leaf's (key, inline value) to `leaf`.
    fn tree(&mut self, root: u64, what: &str, leaf: &mut Visit<'_>) -> Result<(), String> {
        if root == P_INVALID {
            return Ok(()); // an empty database
        }
        self.page(root, leaf, 0).map_err(|e| format!("{what}: {e}"))
    }

    fn page(&mut self, pgno: u64, leaf: &mut Visit<'_>, depth: u32) -> Result<(), String> {
        if depth > 32 {
            return Err("a tree deeper than any LMDB makes (a page pointing back)".into());
        }
        let p = self.fetch(pgno)?;
        let p = &p[..];
        let u16_at = |i: usize| u16::from_le_bytes([p[i], p[i + 1]]);
        let flags = u16_at(10);
        let kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META);
        if kind != P_BRANCH && kind != P_LEAF {
            return Err(format!("page {pgno} is not a tree page (flags {flags:#x})"));
        }
        let (lower, upper) = (u16_at(12) as usize, u16_at(14) as usize);
        if lower < HEADER || lower > upper || upper > self.psize || !(lower - HEADER).is_multiple_of(2) {
            return Err(format!("page {pgno} has impossible bounds ({lower}, {upper})"));
        }
        let mut prev: Option<&[u8]> = None;
        for i in 0..(lower - HEADER) / 2 {
            let at = u16_at(HEADER + 2 * i) as usize;
            let node = p
                .get(at..at + NODE)
                .filter(|_| at >= upper)
                .ok_or(format!("page {pgno}: node {i} lies outside its nodes"))?;
            let (lo, hi, nflags, ksize) = (
                u16::from_le_bytes([node[0], node[1]]) as usize,
                u16::from_le_bytes([node[2], node[3]]) as usize,
                u16::from_le_bytes([node[4], node[5]]),
                u16::from_le_bytes([node[6], node[7]]) as usize,
            );
            let key =
                p.get(at + NODE..at + NODE + ksize).ok_or(format!("page {pgno}: node {i}'s key runs off the page"))?;
            // A branch page's first key is empty by design.
            if let Some(k) = prev.filter(|_| !(kind == P_BRANCH && i == 1)) {
                if !self.ascending(k, key) {
                    return Err(format!("page {pgno}: keys out of order at node {i}"));
                }
            }
            prev = Some(key);
            if kind == P_BRANCH {
                let child = lo as u64 | (hi as u64) << 16 | (nflags as u64) << 32;
                self.page(child, leaf, depth + 1)?;
                continue;
            }
            let dsize = lo | hi << 16;
            if nflags & F_BIGDATA != 0 {
                let d =
                    p.get(at + NODE + ksize..at + NODE + ksize + 8).ok_or(format!("page {pgno}: node {i} runs off"))?;
                let value = self.overflow(u64::from_le_bytes(d.try_into().unwrap()), dsize)?;
                leaf(key, &value)?;
                continue;
            }
            if nflags & !(F_SUBDATA) != 0 {
                return Err(format!("page {pgno}: node {i} has flags {nflags:#x}"));
            }
            let data = p
                .get(at + NODE + ksize..at + NODE + ksize + dsize)
                .ok_or(format!("page {pgno}: node {i}'s value runs off the page"))?;
            leaf(key, data)?;
        }
        if kind == P_BRANCH {
            self.pages.branch += 1;
        } else {
            self.pages.leaf += 1;
        }
        Ok(())
    }

    /// Whether key `b` may follow key `a` in the tree walked.
    fn ascending(&self, a: &[u8], b: &[u8]) -> bool {
        let int = |k: &[u8]| k.try_into().ok().map(u64::from_ne_bytes);
        match (self.integer_keys, int(a), int(b)) {
            (true, Some(a), Some(b)) => a < b,
            (true, _, _) => false,
            (false, _, _) => a < b,
        }
    }

    /// A value's overflow pages: enough of them for its size, each seen once. The value.
    fn overflow(&mut self, pgno: u64, size: usize) -> Result<Vec<u8>, String> {
        let p = self.fetch(pgno)?;
        let count = u32::from_le_bytes(p[12..16].try_into().unwrap()) as u64;
        let flags = u16::from_le_bytes([p[10], p[11]]);
        if flags & P_OVERFLOW == 0 || (count as usize) * self.psize < size + HEADER {
            return Err(format!("overflow page {pgno} does not hold its value"));
        }
        for extra in 1..count {
            let n = pgno.checked_add(extra).filter(|&n| n <= self.last).ok_or("an overflow run past the last page")?;
            if !self.seen.insert(n) || self.free.contains(&n) {
                return Err(format!("overflow page {n} is reached twice or is free"));
            }
        }
        self.pages.overflow += count;
        let mut value = vec![0u8; size];
        if !(self.read)(pgno * self.psize as u64 + HEADER as u64, &mut value) {
            return Err(format!("overflow page {pgno}'s value runs past the file's end"));
        }
        Ok(value)
    }

    /// Page `pgno`, checked to be in the file, numbered as itself, reached once, not free.
    fn fetch(&mut self, pgno: u64) -> Result<Vec<u8>, String> {
        if pgno < 2 || pgno > self.last {
            return Err(format!("a page pointer to {pgno}, outside pages 2..={}", self.last));
        }
        let mut p = vec![0u8; self.psize];
        if !(self.read)(pgno * self.psize as u64, &mut p) {
            return Err(format!("page {pgno} lies past the file's end"));
        }
        if u64::from_le_bytes(p[..8].try_into().unwrap()) != pgno {
            return Err(format!("page {pgno} says it is page {}", u64::from_le_bytes(p[..8].try_into().unwrap())));
        }
        if !self.seen.insert(pgno) {
            return Err(format!("page {pgno} is reached twice"));
        }
        if self.free.contains(&pgno) {
            return Err(format!("page {pgno} is in use and on the free list"));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Change, Ledger};

    #[test]
    fn a_real_ledger_walks_whole_and_a_redirected_node_does_not() {
        let d = std::env::temp_dir().join(format!("htc-pagecheck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("ledger.mdb");
        let l = Ledger::create(&path).unwrap();
        for round in 0..3u32 {
            let mut t = l.write().unwrap();
            for id in 1..=3000 {
                t.apply(&Change::Record(id, crate::ledger::tests::at_line(round))).unwrap();
            }
            t.put_meta("total", &3000u64.to_le_bytes()).unwrap();
            t.commit().unwrap();
        }
        drop(l);
        let file = std::fs::read(&path).unwrap();
        let of = |f: &[u8]| {
            let f = f.to_vec();
            move |at: u64, buf: &mut [u8]| {
                let at = at as usize;
                f.get(at..at + buf.len()).map(|b| buf.copy_from_slice(b)).is_some()
            }
        };
        let pages = check(&of(&file), None, None).unwrap();
        assert_eq!(check_file(&path, None, None).unwrap(), pages);
        assert!(pages.branch >= 1 && pages.leaf > 10, "{pages:?}");
        // Every node offset of every page pushed off by a page's worth: caught wherever it lands.
        let mut caught = 0;
        for pgno in 2..file.len() / 4096 {
            let mut bad = file.clone();
            let at = pgno * 4096 + HEADER;
            let off = u16::from_le_bytes([bad[at], bad[at + 1]]).wrapping_add(0x2000);
            bad[at..at + 2].copy_from_slice(&off.to_le_bytes());
            caught += check(&of(&bad), None, None).is_err() as usize;
        }
        assert!(caught >= (pages.branch + pages.leaf) as usize, "{caught} of {pages:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
