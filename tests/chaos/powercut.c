/*
 * powercut.so — an LD_PRELOAD shim that models what survives a power cut.
 *
 * For every file under $POWERCUT_DIR, each fsync()/fdatasync() copies the file
 * as it stands to "<file>.durable": that copy is what the disk is guaranteed
 * to hold. After the process is killed, the test replaces each file by its
 * .durable copy (or deletes it when it was never synced): exactly the writes
 * made after the last fsync are lost, as on a power cut.
 *
 * Limits of the model: an fsync is taken as an atomic snapshot of the whole
 * file, and writes not yet synced are all lost, never some of them. A real
 * disk may also persist some unsynced writes, in any order, and could tear a
 * page; SQLite's WAL is designed for that (checksummed frames), but this shim
 * does not exercise it.
 *
 * Snapshots are taken one at a time (a process-wide lock). relay fsyncs the
 * WAL from two threads (the writer's commits, the checkpointer's checkpoints
 * beside them), and two copies at once shared one temporary file: each
 * truncated and overwrote the other's, and the first to finish renamed the
 * mix. The durable WAL was then one no disk would hold: CI lost 110
 * acknowledged events once, and on a loaded machine 2 runs in 4 lost ~100;
 * with the lock, 0 in 6. Under the lock each copy is of the file at or
 * after its fsync: all that fsync made durable, and every earlier one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

static int (*real_fsync)(int) = NULL;
static int (*real_fdatasync)(int) = NULL;
static pthread_mutex_t snapshotting = PTHREAD_MUTEX_INITIALIZER;

static void copy_durable(int fd);

static void snapshot(int fd) {
    pthread_mutex_lock(&snapshotting);
    copy_durable(fd);
    pthread_mutex_unlock(&snapshotting);
}

static void copy_durable(int fd) {
    const char *dir = getenv("POWERCUT_DIR");
    if (dir == NULL || *dir == '\0') return;
    char link[64], path[PATH_MAX], copy[PATH_MAX + 16];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    size_t len = strlen(dir);
    if (strncmp(path, dir, len) != 0 || path[len] != '/') return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    snprintf(copy, sizeof copy, "%s.durable.tmp", path);
    int out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0) return;
    off_t offset = 0;
    while (offset < st.st_size) {
        ssize_t sent = sendfile(out, fd, &offset, st.st_size - offset);
        if (sent <= 0) break;
    }
    close(out);
    char durable[PATH_MAX + 16];
    snprintf(durable, sizeof durable, "%s.durable", path);
    rename(copy, durable);
}

int fsync(int fd) {
    if (!real_fsync) real_fsync = dlsym(RTLD_NEXT, "fsync");
    snapshot(fd);
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (!real_fdatasync) real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    snapshot(fd);
    return real_fdatasync(fd);
}
