#!/bin/sh
# GET /cgi-bin/status (busybox httpd CGI): the guest's view, for tests. One key=value a line.
echo "Content-Type: text/plain"
echo
echo "hostname=$(hostname)"
echo "udhcpc=$(pidof udhcpc | wc -w)"
echo "addr=$(ip -4 -o addr show dev eth0 | awk '{print $4}' | tr '\n' ',' | sed 's/,$//')"
echo "mtu=$(cat /sys/class/net/eth0/mtu)"
echo "default=$(ip route show default | awk '{print $3; exit}')"
# the queues virtio-net runs (one rx-N and tx-N per queue pair: multiqueue taps)
echo "queues=$(ls /sys/class/net/eth0/queues | tr '\n' ',' | sed 's/,$//')"
