/*
 * Gregor's pod sandbox process.
 *
 * Every pod's sandbox container runs one process that does nothing but exist: it holds the pod's
 * namespaces open while the pod's containers come and go. When it runs as PID 1 of the sandbox's
 * PID namespace it also inherits orphaned processes, so it reaps them. It exits 0 when asked to
 * stop (SIGINT, SIGTERM) so the runtime records a clean exit.
 *
 * Built statically (gcc -static -O2) by localkube.build; no libraries are needed at run time.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PAUSE_VERSION
#define PAUSE_VERSION "unversioned"
#endif

static void stop(int signo)
{
    (void)signo;
    _exit(0);
}

static void reap_children(int signo)
{
    int saved_errno = errno;

    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
        /* Keep collecting: one SIGCHLD may stand for several exits. */
    }
    errno = saved_errno;
}

static int install(int signo, void (*handler)(int), int flags)
{
    struct sigaction action;

    memset(&action, 0, sizeof(action));
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0)) {
        printf("pause %s (gregor)\n", PAUSE_VERSION);
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--version]\n", argv[0]);
        return 2;
    }
    if (install(SIGINT, stop, 0) != 0 || install(SIGTERM, stop, 0) != 0
        || install(SIGCHLD, reap_children, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
