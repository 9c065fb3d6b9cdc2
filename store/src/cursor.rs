//! A write transaction's own cursor on the task records. A leader reads a task's record when its
//! result comes and writes it back at once; results come in runs of nearby ids (an agent's
//! share of the partition). Through `mdb_get` and `mdb_put` each of those was a walk from the
//! root (two a task: 37% of the leader's core thread with 2 M tasks, bench/RESULTS.md in git's history).
//! Through one cursor, LMDB first looks for the key on the page the cursor stands on, and a
//! record read and then rewritten is replaced where the cursor stands (`MDB_CURRENT`).

use std::cell::Cell;

use lmdb_sys::{
    mdb_cursor_close, mdb_cursor_get, mdb_cursor_open, mdb_cursor_put, MDB_cursor, MDB_dbi, MDB_txn, MDB_val,
    MDB_CURRENT, MDB_GET_CURRENT, MDB_NOTFOUND, MDB_SET_KEY,
};

/// An LMDB return code other than success.
pub(crate) type Code = libc::c_int;

pub(crate) struct TaskCursor {
    /// Opened at first use; null before.
    c: Cell<*mut MDB_cursor>,
    /// The task the cursor stands on, as far as this knows: a hint, checked before it is used
    /// (another writer of the same database may have moved entries meanwhile).
    at: Cell<Option<u64>>,
}

impl TaskCursor {
    pub(crate) fn new() -> TaskCursor {
        TaskCursor { c: Cell::new(std::ptr::null_mut()), at: Cell::new(None) }
    }

    /// # Safety
    ///
    /// `txn` is a live write transaction, the same at every call until `close`, and `dbi` one
    /// of its databases, the same at every call.
    unsafe fn cursor(&self, txn: *mut MDB_txn, dbi: MDB_dbi) -> Result<*mut MDB_cursor, Code> {
        if self.c.get().is_null() {
            let mut c = std::ptr::null_mut();
            match mdb_cursor_open(txn, dbi, &mut c) {
                0 => self.c.set(c),
                rc => return Err(rc),
            }
        }
        Ok(self.c.get())
    }

    /// What `read` makes of the value stored under `key` (task `id`), or `None`. The bytes are
    /// LMDB's, valid only until the transaction next writes: they go no further than `read`.
    ///
    /// # Safety
    ///
    /// As for `cursor`.
    pub(crate) unsafe fn get<R>(
        &self,
        txn: *mut MDB_txn,
        dbi: MDB_dbi,
        id: u64,
        key: &[u8; 8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Code> {
        let c = self.cursor(txn, dbi)?;
        self.at.set(None);
        let mut k = MDB_val { mv_size: key.len(), mv_data: key.as_ptr() as *mut _ };
        let mut v = MDB_val { mv_size: 0, mv_data: std::ptr::null_mut() };
        match mdb_cursor_get(c, &mut k, &mut v, MDB_SET_KEY) {
            0 => {
                self.at.set(Some(id));
                Ok(Some(read(std::slice::from_raw_parts(v.mv_data as *const u8, v.mv_size))))
            }
            MDB_NOTFOUND => Ok(None),
            rc => Err(rc),
        }
    }

    /// Stores `val` under `key` (task `id`): in place when the cursor stands on that key (the
    /// read just before), else where the key goes.
    ///
    /// # Safety
    ///
    /// As for `cursor`.
    pub(crate) unsafe fn put(
        &self,
        txn: *mut MDB_txn,
        dbi: MDB_dbi,
        id: u64,
        key: &[u8; 8],
        val: &[u8],
    ) -> Result<(), Code> {
        let c = self.cursor(txn, dbi)?;
        let here = self.at.replace(None) == Some(id) && self.stands_on(c, key);
        let mut k = MDB_val { mv_size: key.len(), mv_data: key.as_ptr() as *mut _ };
        let mut v = MDB_val { mv_size: val.len(), mv_data: val.as_ptr() as *mut _ };
        match mdb_cursor_put(c, &mut k, &mut v, if here { MDB_CURRENT } else { 0 }) {
            0 => {
                self.at.set(Some(id));
                Ok(())
            }
            rc => Err(rc),
        }
    }

    /// Whether the cursor `c` stands on `key`: a look at its current entry, no search.
    unsafe fn stands_on(&self, c: *mut MDB_cursor, key: &[u8; 8]) -> bool {
        let mut k = MDB_val { mv_size: 0, mv_data: std::ptr::null_mut() };
        let mut v = MDB_val { mv_size: 0, mv_data: std::ptr::null_mut() };
        mdb_cursor_get(c, &mut k, &mut v, MDB_GET_CURRENT) == 0
            && std::slice::from_raw_parts(k.mv_data as *const u8, k.mv_size) == key
    }

    /// Closes the cursor. It must happen before its transaction ends: a write transaction frees
    /// its cursors itself when it ends, and a second close would free it twice.
    pub(crate) fn close(&self) {
        let c = self.c.replace(std::ptr::null_mut());
        if !c.is_null() {
            // SAFETY: a cursor this opened, of a transaction that has not ended (see above).
            unsafe { mdb_cursor_close(c) };
        }
        self.at.set(None);
    }
}

impl Drop for TaskCursor {
    fn drop(&mut self) {
        self.close();
    }
}
