// The add/release baseline: the bare work under a pod network add, exec'd directly as libcni (containerd's
// CNI library) does it, with no Node anywhere.
//   bare-cni add|del CONF RESULT CNI_PATH PLUGIN IFNAME PAR NAME...
//   add: `ip netns add NAME`, then PLUGIN (from CNI_PATH's first dir) with CNI_COMMAND=ADD, CNI_CONTAINERID=NAME,
//        CNI_NETNS=/var/run/netns/NAME, the network config (file CONF) on stdin, its result (stdout) to file RESULT
//        (libcni writes such a cache file too)
//   del: PLUGIN with CNI_COMMAND=DEL (CONF carries prevResult, as libcni sends it), file RESULT removed (libcni's
//        DelNetworkList removes its cache file after the plugins' DEL, and ignores an error), then `ip netns del NAME`
// "%s" in CONF and RESULT stands for NAME. PAR worker processes share the NAMEs. Prints "op <us>" per NAME (after a
// "part netns <us> plugin <us>" line, or "part plugin <us> netns <us>" for del) and "total <us>" for the whole set.
// Exit 0 when every step succeeded; otherwise the failing step on stderr, exit 1.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// spawn argv with env, stdin from in_path (or /dev/null), stdout to out_path (or inherited); wait; 0 on exit 0
static int run(char *const argv[], char *const envp[], const char *in_path, const char *out_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in_path ? in_path : "/dev/null", O_RDONLY, 0);
  if (out_path) posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "bare-cni: spawn %s: %s\n", argv[0], strerror(rc));
    return -1;
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "bare-cni: %s exited %d\n", argv[0], WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return -1;
  }
  return 0;
}

static int one(int add, const char *name, const char *conf_t, const char *result_t, const char *cni_path, const char *plugin, const char *ifname) {
  char plugin_path[4096], e_cmd[64], e_id[256], e_ns[512], e_if[64], e_path[4096], path_var[4096], conf[4096], result[4096];
  const char *dir_end = strchr(cni_path, ':');
  int dir_len = dir_end ? (int)(dir_end - cni_path) : (int)strlen(cni_path);
  snprintf(plugin_path, sizeof plugin_path, "%.*s/%s", dir_len, cni_path, plugin);
  snprintf(conf, sizeof conf, conf_t, name);
  snprintf(result, sizeof result, result_t, name);
  snprintf(e_cmd, sizeof e_cmd, "CNI_COMMAND=%s", add ? "ADD" : "DEL");
  snprintf(e_id, sizeof e_id, "CNI_CONTAINERID=%s", name);
  snprintf(e_ns, sizeof e_ns, "CNI_NETNS=/var/run/netns/%s", name);
  snprintf(e_if, sizeof e_if, "CNI_IFNAME=%s", ifname);
  snprintf(e_path, sizeof e_path, "CNI_PATH=%s", cni_path);
  snprintf(path_var, sizeof path_var, "PATH=%s", getenv("PATH") ? getenv("PATH") : "/usr/sbin:/usr/bin:/sbin:/bin");
  // libcni's environment for a plugin: the CNI_* variables and the caller's PATH
  char *penv[] = {e_cmd, e_id, e_ns, e_if, e_path, "CNI_ARGS=IgnoreUnknown=1", path_var, NULL};
  char *ip[] = {"/usr/sbin/ip", "netns", add ? "add" : "del", (char *)name, NULL};
  char *plug[] = {plugin_path, NULL};
  // each op's two parts on their own lines before its "op" line (bench/add-stages.mjs reads them with PAR 1)
  double t = now_us(), m;
  int r;
  if (add) {
    r = run(ip, environ, NULL, NULL);
    m = now_us();
    r = r || run(plug, penv, conf, result);
    printf("part netns %.1f plugin %.1f\n", m - t, now_us() - m);
  } else {
    r = run(plug, penv, conf, NULL);
    if (r == 0) unlink(result);
    m = now_us();
    r = r || run(ip, environ, NULL, NULL);
    printf("part plugin %.1f netns %.1f\n", m - t, now_us() - m);
  }
  return r;
}

int main(int argc, char **argv) {
  if (argc < 9 || (strcmp(argv[1], "add") != 0 && strcmp(argv[1], "del") != 0)) {
    fprintf(stderr, "usage: bare-cni add|del CONF RESULT CNI_PATH PLUGIN IFNAME PAR NAME...\n");
    return 2;
  }
  int add = strcmp(argv[1], "add") == 0, par = atoi(argv[7]), n = argc - 8;
  char **names = argv + 8;
  if (par < 1) par = 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  double t0 = now_us();
  for (int w = 0; w < par; w++) {
    pid_t p = fork();
    if (p < 0) return perror("fork"), 1;
    if (p > 0) continue;
    for (int i = w; i < n; i += par) {
      double t = now_us();
      if (one(add, names[i], argv[2], argv[3], argv[4], argv[5], argv[6]) != 0) _exit(1);
      printf("op %.1f\n", now_us() - t);
    }
    _exit(0);
  }
  int bad = 0, st;
  while (wait(&st) > 0)
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
  printf("total %.1f\n", now_us() - t0);
  return bad ? 1 : 0;
}
