// sysctls: name=value settings checked and written to /proc/sys inside a netns (sysctlInNetns); the writer is shared
// with netnsMake and the netlink batch.

#include "common.h"

// The first setting that is not name=value with a name of [a-z0-9_.-] (no leading '.', no ".."), or NULL.
const char *sysctl_bad_setting(char **settings) {
  for (char **p = settings; *p; p++) {
    char *eq = strchr(*p, '=');
    size_t nlen = eq ? (size_t)(eq - *p) : 0;
    bool ok = eq && nlen > 0 && nlen < 200 && (*p)[0] != '.' && strstr(*p, "..") == NULL;
    for (size_t i = 0; ok && i < nlen; i++) {
      char c = (*p)[i];
      ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    }
    if (!ok) return *p;
  }
  return NULL;
}

// Writes each checked setting to /proc/sys in the calling thread's netns (/proc/sys/net shows the netns of the thread
// that opens the file); stops at the first failure: its errno, with *failed the setting. 0 when all were written.
int sysctl_write_all(char **settings, const char **failed) {
  for (char **p = settings; *p; p++) {
    char path[256] = "/proc/sys/";
    char *eq = strchr(*p, '=');
    size_t nlen = (size_t)(eq - *p);
    memcpy(path + 10, *p, nlen);
    path[10 + nlen] = '\0';
    for (char *c = path + 10; *c; c++)
      if (*c == '.') *c = '/';
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      *failed = *p;
      return errno;
    }
    size_t vlen = strlen(eq + 1);
    ssize_t w;
    do w = write(fd, eq + 1, vlen);
    while (w < 0 && errno == EINTR);
    int err = w < 0 ? errno : (size_t)w != vlen ? EIO : 0;
    close(fd);
    if (err) {
      *failed = *p;
      return err;
    }
  }
  return 0;
}

// sysctlInNetns(nsPath, ["net.ipv4.conf.all.rp_filter=0", ...]): writes each setting to /proc/sys inside the
// netns. /proc/sys/net shows the netns of the thread that opens the file, so the files are opened inside;
// the netns is left before returning, also on an error. Names are checked before anything is entered.
napi_value js_sysctlInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!get_args(env, info, 2, argv, "sysctlInNetns")) return NULL;
  char *ns_path = get_string(env, argv[0], "sysctlInNetns", "nsPath");
  if (!ns_path) return NULL;
  char **settings = get_string_array(env, argv[1], "sysctlInNetns", "settings");
  napi_value ret = NULL;
  if (!settings) goto out;
  const char *bad = sysctl_bad_setting(settings);
  if (bad) {
    throw_type(env, "sysctlInNetns: setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad);
    goto out;
  }
  netns_guard_t g;
  if (!netns_enter(env, "sysctlInNetns", ns_path, &g)) goto out;
  const char *failed = NULL;
  int err = sysctl_write_all(settings, &failed);
  netns_leave(&g, ns_path);
  if (err) {
    throw_errno(env, err, "sysctl %s in %s", failed, ns_path);
    goto out;
  }
  napi_get_undefined(env, &ret);
out:
  free(ns_path);
  if (settings) free_strv(settings);
  return ret;
}
