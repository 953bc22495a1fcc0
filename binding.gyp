{
  "targets": [
    {
      "target_name": "vmpod_native",
      "sources": ["native/vmpod.c", "native/common.c", "native/fastget.c", "native/spawn.c"],
      "cflags": ["-Wall", "-Wextra", "-O2", "-std=gnu11"],
      "defines": ["NAPI_VERSION=8", "_GNU_SOURCE"]
    }
  ]
}
