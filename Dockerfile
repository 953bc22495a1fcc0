# syntax=docker/dockerfile:1
# vmpod-node's images, from one multi-stage build (docs/deploy.md):
#   podman build --target tapmanager    -t localhost/vmpod-node/tapmanager:0.1.0 .
#   podman build --target libvirt       -t localhost/vmpod-node/libvirt:0.1.0 .
#   podman build --target device-plugin -t localhost/vmpod-node/device-plugin:0.1.0 .
# (docker build the same way; scripts/images.sh builds them, and makes the base images locally where no registry
# answers). The first two run side by side in one privileged pod: deploy/daemonset.yaml; the third is the VFIO
# device plugin's DaemonSet: deploy/device-plugin/.
#
# NPM behind a TLS-intercepting proxy: pass its CA as a build secret, e.g.
#   --secret id=npmca,src=/etc/ssl/certs/ca-certificates.crt
# It is used for `npm ci` only and is not kept in any layer.

ARG NODE_IMAGE=node:24-bookworm-slim
ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build: the addon (node-gyp), tsc, the bundles --------------------------------------------------------------
FROM ${NODE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# the node image keeps Node's headers under /usr/local/include/node: node-gyp builds offline
ENV npm_config_nodedir=/usr/local
COPY package.json package-lock.json binding.gyp tsconfig.json ./
COPY native native
# npm ci's install step (it builds the addon)
COPY scripts/install-addon.mjs scripts/install-addon.mjs
RUN --mount=type=secret,id=npmca \
    if [ -s /run/secrets/npmca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/npmca; fi; \
    npm ci --no-audit --no-fund
COPY scripts/bundle.mjs scripts/protocol-h.mjs scripts/
COPY src src
COPY bin bin
COPY proto proto
# What the runtime stages take: the bundles (esbuild inlines pino and our code; vmwrapper's start path and its V8 code cache), the runtime node_modules
# that stay outside them (gRPC, proto-loader and yaml, loaded by vmwrapper only on the paths that use them), kubelet's
# PodResources .proto, the addon, the bin/ launchers, package.json; and node without its symbols (99 -> 86 MB).
RUN npm run build \
 && npm prune --omit=dev \
 && mkdir -p /out/app/build/Release /out/app/dist /out/bin \
 && cp package.json /out/app/ \
 && cp -r bin /out/app/bin \
 && cp -r proto /out/app/proto \
 && cp -r node_modules /out/app/node_modules \
 && cp -r dist/bundle /out/app/dist/bundle \
 && cp build/Release/vmpod_native.node /out/app/build/Release/ \
 && strip -o /out/bin/node /usr/local/bin/node

# ---- tapmanager-root: the tapmanager image's files, flattened into one layer by the next stage ---------------------
FROM ${DEBIAN_IMAGE} AS tapmanager-root
# iproute2: ip (CNI plugins and tapmanager's own steps). iptables: Debian's package switches `ebtables` to
# ebtables-nft (tapmanager's DHCP filter in the pod netns; the legacy ebtables of the `ebtables` package fails on
# kernels without the legacy tables) and gives the CNI plugins iptables (bridge ipMasq, portmap, firewall).
# Then out go what no program here reads, which a layer on top could only hide, not remove (hence the flattening):
# glibc's iconv modules (gconv: node converts with its own ICU) and the time zone files (tzdata: node has its own,
# and tapmanager logs UTC). Kept: apt, dpkg and perl, so an operator can still install a debugging tool.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 iptables \
 && rm -rf /var/lib/apt/lists/* \
 && dpkg --purge --force-depends tzdata \
 && printf 'path-exclude /usr/lib/x86_64-linux-gnu/gconv/*\n' > /etc/dpkg/dpkg.cfg.d/vmpod-node-excludes \
 && rm -rf /usr/lib/x86_64-linux-gnu/gconv /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log
COPY --from=build /out/bin/node /usr/local/bin/node
# the two bundles tapmanager and tapctl run, the addon, the launchers, package.json (its version); no node_modules:
# esbuild inlined pino and prom-client, and the gRPC/YAML paths of `tapctl devices` belong to the libvirt image
COPY --from=build /out/app/package.json /usr/local/lib/vmpod-node/package.json
COPY --from=build /out/app/bin /usr/local/lib/vmpod-node/bin
COPY --from=build /out/app/build /usr/local/lib/vmpod-node/build
COPY --from=build /out/app/dist/bundle/tapmanager.js /out/app/dist/bundle/tapctl.js /usr/local/lib/vmpod-node/dist/bundle/
RUN ln -s ../lib/vmpod-node/bin/tapmanager.js /usr/local/bin/tapmanager \
 && ln -s ../lib/vmpod-node/bin/tapctl.js /usr/local/bin/tapctl \
 && tapmanager --version && tapctl --version && ebtables --version | grep -q nf_tables

# ---- tapmanager: the daemon and tapctl; no qemu, no compiler; one layer (under 200 MB, docs/deploy.md) ----------
FROM scratch AS tapmanager
COPY --from=tapmanager-root / /
# what the base image's config said (podman kube play gives a container no default PATH)
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENTRYPOINT ["tapmanager"]

# ---- libvirt: libvirtd + qemu, with vmwrapper as the domains' emulator -----------------------------------------
FROM ${DEBIAN_IMAGE} AS libvirt
# libvirt-daemon + the qemu driver without libvirt-daemon-system (which pulls systemd); qemu-utils (qemu-img) and
# ovmf (UEFI firmware) as users of VMs expect; tini as PID 1 (below).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils ovmf tini \
 && rm -rf /var/lib/apt/lists/*
# What libvirt-daemon-system's postinst would make: libvirtd looks up the qemu driver's default user and group
# (libvirt-qemu, kvm) before it reads qemu.conf, and writes each domain's log under /var/log/libvirt/qemu.
RUN (getent group kvm >/dev/null || groupadd -r kvm) \
 && (getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu) \
 && (id -u libvirt-qemu >/dev/null 2>&1 || useradd -r -g libvirt-qemu -G kvm -M -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu) \
 && mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu
COPY deploy/libvirt/qemu.conf /etc/libvirt/qemu.conf
COPY --from=build /out/bin/node /usr/local/bin/node
COPY --from=build /out/app /usr/local/lib/vmpod-node
# <emulator>/vmwrapper</emulator> is the path Virtlet's domain XML uses; /usr/local/bin/vmwrapper for everyone else.
RUN ln -s /usr/local/lib/vmpod-node/dist/bundle/vmwrapper.cjs /vmwrapper \
 && ln -s ../lib/vmpod-node/dist/bundle/vmwrapper.cjs /usr/local/bin/vmwrapper \
 && ln -s ../lib/vmpod-node/bin/tapctl.js /usr/local/bin/tapctl
# libvirtd in the foreground, under tini: as PID 1 itself it would never reap the qemu capability probes, which
# daemonize (libvirt then waits 40 s per zombie). tini forwards SIGTERM to libvirtd, which exits 0.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["libvirtd"]

# ---- device-plugin: vfio-device-plugin alone (docs/device-plugin.md); no qemu, no compiler, no addon -------------
FROM ${DEBIAN_IMAGE} AS device-plugin
COPY --from=build /out/bin/node /usr/local/bin/node
# its bundle and launcher, package.json, the device plugin API's .proto (proto/), and the node_modules its bundle
# leaves out (gRPC, the .proto loader, yaml for a YAML config; scripts/bundle.mjs)
COPY --from=build /out/app/package.json /usr/local/lib/vmpod-node/package.json
COPY --from=build /out/app/bin /usr/local/lib/vmpod-node/bin
COPY --from=build /out/app/proto /usr/local/lib/vmpod-node/proto
COPY --from=build /out/app/node_modules /usr/local/lib/vmpod-node/node_modules
COPY --from=build /out/app/dist/bundle/vfio-device-plugin.js /usr/local/lib/vmpod-node/dist/bundle/vfio-device-plugin.js
RUN ln -s ../lib/vmpod-node/bin/vfio-device-plugin.js /usr/local/bin/vfio-device-plugin \
 && vfio-device-plugin --help >/dev/null
ENTRYPOINT ["vfio-device-plugin"]
