//! Keeping the signals claimgate handles (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) off the
//! worker's own threads.
//!
//! **Invariant:** every thread that blocks in a Redis read or a commit calls
//! [`block_termination`] first, so a handled signal is only ever taken by a thread that is
//! not inside a socket read (the one blocked in `join`, or one of the signal threads `cli`
//! starts: `shutdown`, which triggers the `Shutdown`, and `signals`), never by one inside a
//! socket read.

/// Keeps SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 off the calling thread; the caller's
/// thread (blocked in `join`) takes them. Delivered to a thread inside a socket read with a
/// timeout, a handled signal fails the read with EINTR even under SA_RESTART: a lost
/// XREADGROUP reply leaves entries Redis counts as delivered pending after a clean SIGTERM,
/// and a SIGHUP sent by logrotate would cut a read short for nothing.
pub(super) fn block_termination() {
    // SAFETY: `set` is plain data initialised by sigemptyset; pthread_sigmask changes only the
    // calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}
