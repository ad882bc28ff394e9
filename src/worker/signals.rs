//! Keeping SIGINT and SIGTERM off the worker's own threads.
//!
//! **Invariant:** every thread that blocks in a Redis read or a commit calls
//! [`block_termination`] first, so a termination signal is only ever taken by the thread
//! blocked in `join` (which sets the shutdown flag), never by one inside a socket read.

/// Keeps SIGINT and SIGTERM off the calling thread; the caller's thread (blocked in `join`)
/// takes them and sets the shutdown flag. Delivered to a thread inside a socket read with a
/// timeout, a signal fails the read with EINTR even under SA_RESTART: a lost XREADGROUP reply
/// leaves entries Redis counts as delivered pending after a clean SIGTERM.
pub(super) fn block_termination() {
    // SAFETY: `set` is plain data initialised by sigemptyset; pthread_sigmask changes only the
    // calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}
