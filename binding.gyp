{
  "targets": [
    {
      "target_name": "vmpod_native",
      "sources": [
        "native/vmpod.c", "native/common.c", "native/sockets.c", "native/poller.c", "native/fastget.c", "native/fastget_js.c",
        "native/files.c", "native/process.c", "native/exec.c", "native/spawn.c", "native/netns.c", "native/tap.c", "native/sysctl.c",
        "native/netsock.c", "native/netlink.c"
      ],
      "cflags": ["-Wall", "-Wextra", "-O2", "-std=gnu11"],
      "defines": ["NAPI_VERSION=8", "_GNU_SOURCE"]
    }
  ]
}
