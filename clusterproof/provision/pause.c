/*
 * pause: the pod sandbox ("infra") process of the CRI sandbox image.
 *
 * Why our own: a real node's containerd starts every pod with a sandbox image
 * (registry.k8s.io/pause), and this machine reaches no container registry, so
 * the sandbox image has to be built here (clusterproof/provision/images.py,
 * PAUSE). This is the same contract as Kubernetes' build/pause/linux/pause.c: hold the pod's
 * namespaces by sleeping forever, reap zombies when it is PID 1 of a shared
 * PID namespace (SIGCHLD), and exit 0 on SIGINT/SIGTERM so the runtime can
 * stop the sandbox promptly. Built `gcc -static -Os -s`: no libc in the image.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define STR_(x) #x
#define STR(x) STR_(x)
#ifndef VERSION
#define VERSION clusterproof-1
#endif

static void sigdown(int signo) {
    psignal(signo, "pause: shutting down, got signal");
    _exit(0);
}

static void sigreap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) {
            printf("pause %s\n", STR(VERSION));
            return 0;
        }
    }
    if (getpid() != 1)
        /* Not an error: useful when run by hand or in a test. */
        fprintf(stderr, "pause: warning: not PID 1, zombies are reaped only for my own children\n");

    struct sigaction down = {.sa_handler = sigdown};
    struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
        sigaction(SIGCHLD, &reap, NULL) < 0) {
        fprintf(stderr, "pause: sigaction: %s\n", strerror(errno));
        return 1;
    }
    for (;;)
        pause();
    fprintf(stderr, "pause: error: infinite loop terminated\n");
    return 42;
}
