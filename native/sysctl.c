// sysctls: name=value settings checked and written to /proc/sys in the calling thread's netns, for netnsMake and the
// netlink batch (both run on a pool thread inside the netns).

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
