# vmpod-node: tapmanager, vmwrapper and tapctl in one image for the VM runtime's DaemonSet.
# tapmanager runs privileged with the host's network and PID namespaces and these host paths mounted:
# /var/run/netns (Bidirectional), /var/lib/virtlet, /var/lib/cni, /var/lib/vmpod-node, /etc/cni/net.d, /opt/cni/bin, /sys, /dev.
# The libvirt container of the same pod uses /usr/local/lib/vmpod-node/bin/vmwrapper.js as the domains' <emulator>.

FROM node:20-bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json binding.gyp tsconfig.json ./
COPY native native
# the node image keeps Node's headers under /usr/local/include/node: no download
ENV npm_config_nodedir=/usr/local
RUN npm ci --no-audit --no-fund
COPY src src
COPY scripts scripts
COPY bin bin
COPY proto proto
RUN npm run build && npm prune --omit=dev

FROM node:20-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 ebtables util-linux qemu-system-x86 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /usr/local/lib/vmpod-node
COPY --from=build /src/package.json ./
COPY --from=build /src/node_modules node_modules
COPY --from=build /src/build/Release/vmpod_native.node build/Release/
COPY --from=build /src/dist dist
# kubelet's PodResources .proto, read by vmwrapper's gRPC client (loaded only when it asks kubelet)
COPY --from=build /src/proto proto
COPY --from=build /src/bin bin
RUN ln -s /usr/local/lib/vmpod-node/bin/tapmanager.js /usr/local/bin/tapmanager \
 && ln -s /usr/local/lib/vmpod-node/bin/vmwrapper.js /usr/local/bin/vmwrapper \
 && ln -s /usr/local/lib/vmpod-node/bin/tapctl.js /usr/local/bin/tapctl
ENTRYPOINT ["tapmanager"]
