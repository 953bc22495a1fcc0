// Errors and argument helpers shared by the addon's files (declared in common.h).
#include "common.h"

// ---------------------------------------------------------------------------------------------
// errors

static const struct {
  int num;
  const char *name;
} errno_names[] = {
    {EPERM, "EPERM"},
    {ENOENT, "ENOENT"},
    {ESRCH, "ESRCH"},
    {EINTR, "EINTR"},
    {EIO, "EIO"},
    {ENXIO, "ENXIO"},
    {E2BIG, "E2BIG"},
    {ENOEXEC, "ENOEXEC"},
    {EBADF, "EBADF"},
    {ECHILD, "ECHILD"},
    {EAGAIN, "EAGAIN"},
    {ENOMEM, "ENOMEM"},
    {EACCES, "EACCES"},
    {EFAULT, "EFAULT"},
    {EBUSY, "EBUSY"},
    {EEXIST, "EEXIST"},
    {EXDEV, "EXDEV"},
    {ENODEV, "ENODEV"},
    {ENOTDIR, "ENOTDIR"},
    {EISDIR, "EISDIR"},
    {EINVAL, "EINVAL"},
    {ENFILE, "ENFILE"},
    {EMFILE, "EMFILE"},
    {ENOTTY, "ENOTTY"},
    {ETXTBSY, "ETXTBSY"},
    {EFBIG, "EFBIG"},
    {ENOSPC, "ENOSPC"},
    {ESPIPE, "ESPIPE"},
    {EROFS, "EROFS"},
    {EMLINK, "EMLINK"},
    {EPIPE, "EPIPE"},
    {ERANGE, "ERANGE"},
    {ENAMETOOLONG, "ENAMETOOLONG"},
    {ENOSYS, "ENOSYS"},
    {ENOTEMPTY, "ENOTEMPTY"},
    {ELOOP, "ELOOP"},
    {EOVERFLOW, "EOVERFLOW"},
    {ENOTSOCK, "ENOTSOCK"},
    {EDESTADDRREQ, "EDESTADDRREQ"},
    {EMSGSIZE, "EMSGSIZE"},
    {EPROTOTYPE, "EPROTOTYPE"},
    {ENOPROTOOPT, "ENOPROTOOPT"},
    {EPROTONOSUPPORT, "EPROTONOSUPPORT"},
    {EOPNOTSUPP, "EOPNOTSUPP"},
    {EAFNOSUPPORT, "EAFNOSUPPORT"},
    {EADDRINUSE, "EADDRINUSE"},
    {EADDRNOTAVAIL, "EADDRNOTAVAIL"},
    {ENETDOWN, "ENETDOWN"},
    {ENETUNREACH, "ENETUNREACH"},
    {ECONNABORTED, "ECONNABORTED"},
    {ECONNRESET, "ECONNRESET"},
    {ENOBUFS, "ENOBUFS"},
    {EISCONN, "EISCONN"},
    {ENOTCONN, "ENOTCONN"},
    {ETIMEDOUT, "ETIMEDOUT"},
    {ECONNREFUSED, "ECONNREFUSED"},
    {EHOSTDOWN, "EHOSTDOWN"},
    {EHOSTUNREACH, "EHOSTUNREACH"},
    {EALREADY, "EALREADY"},
    {EINPROGRESS, "EINPROGRESS"},
    {ENOMEDIUM, "ENOMEDIUM"},
    {ECANCELED, "ECANCELED"},
};

const char *errno_name(int err, char *buf, size_t len) {
  for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
    if (errno_names[i].num == err) return errno_names[i].name;
  snprintf(buf, len, "E%d", err);
  return buf;
}

// Error("<what>: ENAME (strerror)") with code and errno, or NULL when N-API itself fails.
napi_value errno_error(napi_env env, int err, const char *what) {
  char namebuf[16], msg[768];
  const char *name = errno_name(err, namebuf, sizeof(namebuf));
  char sbuf[128];
  const char *s = strerror_r(err, sbuf, sizeof(sbuf));  // GNU variant: returns the message
  snprintf(msg, sizeof(msg), "%s: %s (%s)", what, name, s);
  napi_value jmsg, jcode, jerr, jerrno;
  if (napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &jmsg) != napi_ok ||
      napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &jcode) != napi_ok ||
      napi_create_error(env, NULL, jmsg, &jerr) != napi_ok ||
      napi_create_int32(env, err, &jerrno) != napi_ok)
    return NULL;
  napi_set_named_property(env, jerr, "code", jcode);
  napi_set_named_property(env, jerr, "errno", jerrno);
  return jerr;
}

// Throws errno_error for `what` (printf format). Always returns NULL so callers can `return throw_errno(...)`.
__attribute__((format(printf, 3, 4))) napi_value throw_errno(napi_env env, int err,
                                                                     const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  napi_value jerr = errno_error(env, err, what);
  if (jerr) napi_throw(env, jerr);
  else napi_throw_error(env, NULL, what);
  return NULL;
}

// Throws Error (TypeError with type) "msg" whose code is err's name and errno err, without strerror in the message:
// every error the addon throws carries both, as errno_error's do.
static void throw_coded(napi_env env, bool type, int err, const char *msg) {
  char namebuf[16];
  napi_value jmsg, jcode, jerr, jerrno;
  if (napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &jmsg) != napi_ok ||
      napi_create_string_utf8(env, errno_name(err, namebuf, sizeof(namebuf)), NAPI_AUTO_LENGTH, &jcode) != napi_ok ||
      (type ? napi_create_type_error(env, NULL, jmsg, &jerr) : napi_create_error(env, NULL, jmsg, &jerr)) != napi_ok ||
      napi_create_int32(env, err, &jerrno) != napi_ok) {
    napi_throw_error(env, NULL, msg);  // out of memory: the message at least
    return;
  }
  napi_set_named_property(env, jerr, "code", jcode);
  napi_set_named_property(env, jerr, "errno", jerrno);
  napi_throw(env, jerr);
}

__attribute__((format(printf, 2, 3))) napi_value throw_type(napi_env env, const char *fmt,
                                                                   ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  throw_coded(env, true, EINVAL, msg);
  return NULL;
}

// Something in N-API itself failed: an exception a getter threw stays; a value of the wrong kind is EINVAL (a
// TypeError, as bad arguments are), anything else ENOMEM (what makes N-API fail to create a value).
napi_value throw_napi(napi_env env, const char *what) {
  bool pending = false;
  napi_is_exception_pending(env, &pending);
  if (pending) return NULL;
  const napi_extended_error_info *info = NULL;
  napi_status st = napi_get_last_error_info(env, &info) == napi_ok && info ? info->error_code : napi_generic_failure;
  bool kind = st == napi_invalid_arg || st == napi_object_expected || st == napi_string_expected ||
              st == napi_name_expected || st == napi_function_expected || st == napi_number_expected ||
              st == napi_boolean_expected || st == napi_array_expected || st == napi_bigint_expected;
  throw_coded(env, kind, kind ? EINVAL : ENOMEM, what);
  return NULL;
}


// ---------------------------------------------------------------------------------------------
// argument helpers. Each returns false with a pending TypeError.

bool get_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv,
                     const char *fn) {
  size_t argc = want;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) {
    throw_napi(env, "napi_get_cb_info failed");
    return false;
  }
  (void)fn;
  return true;
}

// An integral JS number in [min, max].
bool get_int(napi_env env, napi_value v, const char *fn, const char *name, int64_t min,
                    int64_t max, int64_t *out) {
  napi_valuetype t;
  double d;
  if (napi_typeof(env, v, &t) != napi_ok || t != napi_number ||
      napi_get_value_double(env, v, &d) != napi_ok || d != d || d < (double)min ||
      d > (double)max || d != (double)(int64_t)d) {
    throw_type(env, "%s: %s must be an integer in [%lld, %lld]", fn, name, (long long)min,
               (long long)max);
    return false;
  }
  *out = (int64_t)d;
  return true;
}

bool get_fd(napi_env env, napi_value v, const char *fn, int *fd) {
  int64_t x;
  // Negative fds are passed to the kernel, which answers EBADF: close(-1) is an EBADF error, not a TypeError.
  if (!get_int(env, v, fn, "fd", INT32_MIN, INT32_MAX, &x)) return false;
  *fd = (int)x;
  return true;
}

bool get_bool(napi_env env, napi_value v, const char *fn, const char *name, bool *out) {
  napi_valuetype t;
  if (napi_typeof(env, v, &t) != napi_ok || t != napi_boolean ||
      napi_get_value_bool(env, v, out) != napi_ok) {
    throw_type(env, "%s: %s must be a boolean", fn, name);
    return false;
  }
  return true;
}

// A malloc'd UTF-8 copy of a JS string without embedded NUL bytes. Caller frees.
char *get_string(napi_env env, napi_value v, const char *fn, const char *name) {
  napi_valuetype t;
  size_t len = 0, got = 0;
  if (napi_typeof(env, v, &t) != napi_ok || t != napi_string ||
      napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) {
    throw_type(env, "%s: %s must be a string", fn, name);
    return NULL;
  }
  char *s = malloc(len + 1);
  if (!s) {
    throw_errno(env, ENOMEM, "%s: %s", fn, name);
    return NULL;
  }
  if (napi_get_value_string_utf8(env, v, s, len + 1, &got) != napi_ok) {
    free(s);
    throw_napi(env, "napi_get_value_string_utf8 failed");
    return NULL;
  }
  if (strlen(s) != got) {
    free(s);
    throw_type(env, "%s: %s must not contain NUL characters", fn, name);
    return NULL;
  }
  return s;
}

// Bytes of a Buffer / Uint8Array (borrowed, valid during the call).
bool get_bytes(napi_env env, napi_value v, const char *fn, const char *name,
                      const uint8_t **data, size_t *len) {
  bool is = false;
  napi_typedarray_type type;
  void *p = NULL;
  size_t n = 0;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is ||
      napi_get_typedarray_info(env, v, &type, &n, &p, NULL, NULL) != napi_ok ||
      type != napi_uint8_array) {
    throw_type(env, "%s: %s must be a Buffer or Uint8Array", fn, name);
    return false;
  }
  *data = p;
  *len = n;
  return true;
}

bool get_array_len(napi_env env, napi_value v, const char *fn, const char *name,
                          uint32_t *len) {
  bool is = false;
  if (napi_is_array(env, v, &is) != napi_ok || !is ||
      napi_get_array_length(env, v, len) != napi_ok) {
    throw_type(env, "%s: %s must be an array", fn, name);
    return false;
  }
  return true;
}

// An array of fds (integers >= 0), malloc'd (NULL with *n = 0 for an empty array). Caller frees.
bool get_fd_array(napi_env env, napi_value v, const char *fn, const char *name, int **out,
                         uint32_t *n, uint32_t maxn) {
  uint32_t len;
  *out = NULL;
  *n = 0;
  if (!get_array_len(env, v, fn, name, &len)) return false;
  if (len > maxn) {
    throw_errno(env, EINVAL, "%s: %s: %u fds, at most %u allowed", fn, name, len, maxn);
    return false;
  }
  if (len == 0) return true;
  int *fds = malloc(sizeof(int) * len);
  if (!fds) {
    throw_errno(env, ENOMEM, "%s: %s", fn, name);
    return false;
  }
  for (uint32_t i = 0; i < len; i++) {
    napi_value e;
    int64_t x;
    if (napi_get_element(env, v, i, &e) != napi_ok) {
      free(fds);
      throw_napi(env, "napi_get_element failed");
      return false;
    }
    if (!get_int(env, e, fn, "fd array element", 0, INT32_MAX, &x)) {
      free(fds);
      return false;
    }
    fds[i] = (int)x;
  }
  *out = fds;
  *n = len;
  return true;
}

void free_strv(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

// A NULL-terminated malloc'd array of malloc'd strings. Caller frees with free_strv.
char **get_string_array(napi_env env, napi_value v, const char *fn, const char *name) {
  uint32_t len;
  if (!get_array_len(env, v, fn, name, &len)) return NULL;
  char **out = calloc((size_t)len + 1, sizeof(char *));
  if (!out) {
    throw_errno(env, ENOMEM, "%s: %s", fn, name);
    return NULL;
  }
  for (uint32_t i = 0; i < len; i++) {
    napi_value e;
    if (napi_get_element(env, v, i, &e) != napi_ok) {
      free_strv(out);
      throw_napi(env, "napi_get_element failed");
      return NULL;
    }
    out[i] = get_string(env, e, fn, name);
    if (!out[i]) {
      free_strv(out);
      return NULL;
    }
  }
  return out;
}

napi_value make_int(napi_env env, int64_t x) {
  napi_value v;
  if (napi_create_int64(env, x, &v) != napi_ok) return throw_napi(env, "napi_create_int64 failed");
  return v;
}

napi_value make_undefined(napi_env env) {
  napi_value v;
  napi_get_undefined(env, &v);
  return v;
}

napi_value make_null(napi_env env) {
  napi_value v;
  napi_get_null(env, &v);
  return v;
}

// One SCM_RIGHTS control message of n fds (n > 0) in ctl, which holds CMSG_SPACE(n ints), aligned for a cmsghdr
// and zeroed; returns its length for msg_controllen.
size_t put_scm_rights(char *ctl, const int *fds, size_t n) {
  struct cmsghdr *c = (struct cmsghdr *)ctl;
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  return CMSG_SPACE(sizeof(int) * n);
}

void close_fds(const int *fds, size_t n) {
  for (size_t i = 0; i < n; i++) close(fds[i]);
}

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


// Settles a pool-thread work's promise: rejected with errno_error(err, what) when err is set, else resolved with ok
// (undefined when NULL).
void settle_promise(napi_env env, napi_deferred deferred, int err, const char *what, napi_value ok) {
  napi_value v = ok;
  if (err) {
    v = errno_error(env, err, what);
    if (!v) napi_create_string_utf8(env, what, NAPI_AUTO_LENGTH, &v);
    napi_reject_deferred(env, deferred, v);
    return;
  }
  if (!v) napi_get_undefined(env, &v);
  napi_resolve_deferred(env, deferred, v);
}

// A promise settled by `done` once `execute` ran on a pool thread; NULL with an exception pending on failure.
napi_value queue_promise(napi_env env, const char *name, napi_async_execute_callback execute,
                                napi_async_complete_callback done, void *data, napi_async_work *work, napi_deferred *deferred) {
  napi_value promise = NULL, name_v;
  if (napi_create_promise(env, deferred, &promise) != napi_ok ||
      napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &name_v) != napi_ok ||
      napi_create_async_work(env, NULL, name_v, execute, done, data, work) != napi_ok)
    return throw_napi(env, "napi async work");
  if (napi_queue_async_work(env, *work) != napi_ok) {
    napi_delete_async_work(env, *work);
    return throw_napi(env, "napi_queue_async_work");
  }
  return promise;
}
