/* The native per-call hook command: relay.py's protocol in a process that starts in about a
 * millisecond, where an interpreter's start alone costs ten or more.  `loopwatch hook install`
 * compiles it with the Python it runs under and that Python's hooks directory built in:
 *
 *     cc -O2 -DLW_PYTHON='"/path/to/python"' -DLW_HOOKS='"/path/to/streams/integrations/hooks"' relay.c
 *
 * and runs it as `<binary> <cli> [--socket PATH] [--timeout S] [--fail-closed]`.
 *
 * It answers only when the serve process gives a decision (an `O` answer).  Everything else is
 * left to Python so that stdout, stderr and the exit status stay relay.py's, byte for byte:
 * - arguments it does not take as they are (an unknown CLI or flag, a timeout that is not plain
 *   digits, a socket path that is not ASCII): it execs `python -I -S relay.py` with the same
 *   arguments before reading anything, so relay.py does all of it;
 * - no decision (the serve process away, too slow, an E or X answer, an input over 4 MiB): it
 *   execs call.py's `unanswered` with the input it read and the failure, spelled as Python's
 *   socket module spells it ("[Errno 2] No such file or directory", "timed out") or as the
 *   serve process's raw answer, which Python decodes and trims as relay.py does.
 * Nothing is sent twice: once the request has gone out, the fallback never asks again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#ifndef LW_PYTHON
#error "LW_PYTHON: the interpreter of the fallback, as a string"
#endif
#ifndef LW_HOOKS
#error "LW_HOOKS: the directory of relay.py and call.py, as a string"
#endif

#define MAGIC "LWR1 "
#define MAX_INPUT (4 * 1024 * 1024) /* call.MAX_LINE */
#define MAX_ANSWER (MAX_INPUT + 1024)
#define DEFAULT_TIMEOUT_MS 5000.0

/* call.unanswered with what this process read and how the ask failed.  argv: call.py, the CLI,
 * the socket path, 1 to fail closed, then either "t" and the failure's text, or "b" and the
 * length of the serve process's answer body, which stdin carries before the hook input. */
static const char FALLBACK[] =
    "import sys\n"
    "from importlib.util import module_from_spec, spec_from_file_location\n"
    "spec = spec_from_file_location('loopwatch_hook_call', sys.argv[1])\n"
    "call = module_from_spec(spec)\n"
    "spec.loader.exec_module(call)\n"
    "data = sys.stdin.buffer.read()\n"
    "if sys.argv[5] == 'b':\n"
    "    n = int(sys.argv[6])\n"
    "    body, raw = data[:n], data[n:]\n"
    "    why = body.decode('utf-8', 'replace').strip()[:300] or 'no answer'\n"
    "else:\n"
    "    raw, why = data, sys.argv[6]\n"
    "import os\n"
    "path = os.fsencode(sys.argv[3]).decode('utf-8', 'replace')\n"
    "sys.exit(int(call.unanswered(sys.argv[2], raw, path, ValueError(why), sys.argv[4] == '1')))\n";

static const char *const CLIS[] = {"claude-code", "codex", "gemini"};

static char *input;
static size_t input_len;

static void python_relay(char **argv) {
    /* relay.py with this command's own arguments and stdin untouched: every answer is its own. */
    int argc = 0;
    while (argv[argc]) argc++;
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args) _exit(70);
    args[0] = LW_PYTHON;
    args[1] = "-I";
    args[2] = "-S";
    args[3] = LW_HOOKS "/relay.py";
    for (int i = 1; i < argc; i++) args[i + 3] = argv[i];
    execv(LW_PYTHON, args);
    dprintf(2, "loopwatch hook: cannot run %s: %s\n", LW_PYTHON, strerror(errno));
    _exit(127);
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static void unanswered(const char *cli, const char *path, int closed, const char *text, const char *body,
                       size_t body_len) {
    /* stdin becomes an unlinked file holding the answer body (if any) and the input read. */
    int fd = -1;
#ifdef __linux__
    fd = memfd_create("loopwatch-relay", 0);
#endif
    if (fd < 0) {
        FILE *f = tmpfile();
        if (f) fd = dup(fileno(f));
    }
    if (fd < 0 || (body && write_all(fd, body, body_len) < 0) || write_all(fd, input, input_len) < 0 ||
        lseek(fd, 0, SEEK_SET) < 0 || dup2(fd, 0) < 0) {
        dprintf(2, "loopwatch hook: cannot hand the input to %s: %s\n", LW_PYTHON, strerror(errno));
        _exit(70);
    }
    char length[32];
    snprintf(length, sizeof length, "%zu", body_len);
    char *args[] = {LW_PYTHON, "-I", "-S", "-c", (char *)FALLBACK, LW_HOOKS "/call.py", (char *)cli, (char *)path,
                    closed ? "1" : "0", body ? "b" : "t", body ? length : (char *)text, NULL};
    execv(LW_PYTHON, args);
    dprintf(2, "loopwatch hook: cannot run %s: %s\n", LW_PYTHON, strerror(errno));
    _exit(127);
}

/* How Python's socket module words an OSError from errno. */
static char oserror[512];
static const char *errno_text(int err) {
    snprintf(oserror, sizeof oserror, "[Errno %d] %s", err, strerror(err));
    return oserror;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

/* 1 when fd is ready for events before the deadline, 0 on timeout, -1 with errno. */
static int wait_for(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)(left + 0.999));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n > 0) return 1;
    }
}

/* A timeout as relay.py takes it, for plain decimals only ("5", "0.5", ".5"): 1 and the
 * milliseconds, or 0 for anything else (left to Python's float()). */
static int plain_timeout(const char *s, double *ms) {
    const char *p = s;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') p++, digits++;
    }
    if (*p || !digits) return 0;
    double seconds = strtod(s, NULL);
    if (!(seconds > 0 && seconds <= 600)) return 0;
    *ms = seconds * 1000.0;
    return 1;
}

static int ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return 0;
    return 1;
}

int main(int argc, char **argv) {
    const char *cli = NULL;
    if (argc >= 2)
        for (size_t i = 0; i < sizeof CLIS / sizeof *CLIS; i++)
            if (strcmp(argv[1], CLIS[i]) == 0) cli = CLIS[i];
    if (!cli) python_relay(argv);
    const char *path = NULL;
    double timeout_ms = DEFAULT_TIMEOUT_MS;
    int closed = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--fail-closed") == 0) {
            closed = 1;
        } else if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc && ascii(argv[i + 1])) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc && plain_timeout(argv[i + 1], &timeout_ms)) {
            i++;
        } else {
            python_relay(argv);
        }
    }
    char default_path[4200];
    if (!path) {
        const char *explicit = getenv("LOOPWATCH_HOOK_SOCKET");
        if (explicit && *explicit) {
            path = explicit;
        } else {
            const char *base = getenv("XDG_RUNTIME_DIR");
            if (!base || !*base) base = getenv("TMPDIR");
            if (!base || !*base) base = "/tmp";
            size_t n = strlen(base);
            while (n && base[n - 1] == '/') n--;
            if (n > 4096) python_relay(argv);
            snprintf(default_path, sizeof default_path, "%.*s/loopwatch-hook-%u.sock", (int)n, base,
                     (unsigned)getuid());
            path = default_path;
        }
    }
    signal(SIGPIPE, SIG_IGN); /* as in Python: a closed peer is EPIPE, not the end of the process */

    size_t cap = 65536;
    input = malloc(cap);
    if (!input) return 70;
    for (;;) {
        if (input_len == cap) {
            cap = cap * 2 > MAX_INPUT + 1 ? MAX_INPUT + 1 : cap * 2;
            char *more = realloc(input, cap);
            if (!more) return 70;
            input = more;
        }
        ssize_t n = read(0, input + input_len, cap - input_len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            dprintf(2, "loopwatch hook: cannot read the hook input: %s\n", strerror(errno));
            return 1;
        }
        if (n == 0) break;
        input_len += (size_t)n;
        if (input_len > MAX_INPUT) break;
    }
    if (input_len > MAX_INPUT) {
        static char longer[64];
        snprintf(longer, sizeof longer, "longer than %d bytes", MAX_INPUT);
        unanswered(cli, path, closed, longer, NULL, 0);
    }

    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    size_t path_len = strlen(path);
    /* Python keeps room for the terminating NUL */
    if (path_len >= sizeof addr.sun_path) unanswered(cli, path, closed, "AF_UNIX path too long", NULL, 0);
    memcpy(addr.sun_path, path, path_len);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
    fcntl(s, F_SETFD, FD_CLOEXEC); /* not the fallback's */
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    /* Python's timeout rules: connect and the whole send each within the timeout, each recv too. */
    double deadline = now_ms() + timeout_ms;
    if (connect(s, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_len)) < 0) {
        int err = errno;
        if (err != EINPROGRESS && err != EINTR) unanswered(cli, path, closed, errno_text(err), NULL, 0);
        int ready = wait_for(s, POLLOUT, deadline);
        if (ready == 0) unanswered(cli, path, closed, "timed out", NULL, 0);
        if (ready < 0) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
        socklen_t len = sizeof err;
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        if (err) unanswered(cli, path, closed, errno_text(err), NULL, 0);
    }
    size_t head_len = strlen(MAGIC) + strlen(cli) + 1;
    char head[64];
    snprintf(head, sizeof head, MAGIC "%s\n", cli);
    struct {
        const char *buf;
        size_t len;
    } parts[2] = {{head, head_len}, {input, input_len}};
    deadline = now_ms() + timeout_ms;
    for (int k = 0; k < 2; k++) {
        const char *buf = parts[k].buf;
        size_t left = parts[k].len;
        while (left) {
            ssize_t n = send(s, buf, left, 0);
            if (n >= 0) {
                buf += n;
                left -= (size_t)n;
                continue;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
            int ready = wait_for(s, POLLOUT, deadline);
            if (ready == 0) unanswered(cli, path, closed, "timed out", NULL, 0);
            if (ready < 0) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
        }
    }
    if (shutdown(s, SHUT_WR) < 0) unanswered(cli, path, closed, errno_text(errno), NULL, 0);

    size_t acap = 65536, alen = 0;
    char *answer = malloc(acap);
    if (!answer) return 70;
    for (;;) {
        if (acap - alen < 65536) {
            char *more = realloc(answer, acap * 2);
            if (!more) return 70;
            answer = more;
            acap *= 2;
        }
        ssize_t n = recv(s, answer + alen, 65536, 0);
        if (n > 0) {
            alen += (size_t)n;
            if (alen > MAX_ANSWER) unanswered(cli, path, closed, "answer too long", NULL, 0);
            continue;
        }
        if (n == 0) break;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
        int ready = wait_for(s, POLLIN, now_ms() + timeout_ms);
        if (ready == 0) unanswered(cli, path, closed, "timed out", NULL, 0);
        if (ready < 0) unanswered(cli, path, closed, errno_text(errno), NULL, 0);
    }
    close(s);
    if (alen == 0 || answer[0] != 'O') {
        static const char none[] = "";
        unanswered(cli, path, closed, NULL, alen ? answer + 1 : none, alen ? alen - 1 : 0);
    }
    if (alen > 1 && write_all(1, answer + 1, alen - 1) < 0) return 1;
    return 0;
}
