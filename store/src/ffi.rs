//! The parts of LMDB's C interface that lmdb-rkv does not expose (it links LMDB but does not
//! re-export its FFI); these are from lmdb.h.

extern "C" {
    pub(crate) fn mdb_env_get_fd(env: *mut libc::c_void, fd: *mut libc::c_int) -> libc::c_int;
    pub(crate) fn mdb_env_get_path(env: *mut libc::c_void, path: *mut *const libc::c_char) -> libc::c_int;
    pub(crate) fn mdb_cursor_open(
        txn: *mut libc::c_void,
        dbi: libc::c_uint,
        cursor: *mut *mut libc::c_void,
    ) -> libc::c_int;
    pub(crate) fn mdb_cursor_get(
        cursor: *mut libc::c_void,
        key: *mut MdbVal,
        data: *mut MdbVal,
        op: libc::c_int,
    ) -> libc::c_int;
    pub(crate) fn mdb_cursor_put(
        cursor: *mut libc::c_void,
        key: *mut MdbVal,
        data: *mut MdbVal,
        flags: libc::c_uint,
    ) -> libc::c_int;
    pub(crate) fn mdb_cursor_close(cursor: *mut libc::c_void);
    pub(crate) fn mdb_txn_id(txn: *mut libc::c_void) -> libc::size_t;
    pub(crate) fn mdb_env_set_assert(
        env: *mut libc::c_void,
        func: Option<unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char)>,
    ) -> libc::c_int;
}

/// lmdb.h's MDB_val.
#[repr(C)]
pub(crate) struct MdbVal {
    pub(crate) size: libc::size_t,
    pub(crate) data: *mut libc::c_void,
}

/// lmdb.h: of MDB_cursor_op, MDB_GET_CURRENT, MDB_NEXT and MDB_SET_KEY; MDB_CURRENT of the write
/// flags; MDB_NOTFOUND.
pub(crate) const MDB_GET_CURRENT: libc::c_int = 4;
pub(crate) const MDB_NEXT: libc::c_int = 8;
pub(crate) const MDB_SET_KEY: libc::c_int = 16;
pub(crate) const MDB_CURRENT: libc::c_uint = 0x40;
pub(crate) const MDB_NOTFOUND: libc::c_int = -30798;
