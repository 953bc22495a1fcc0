#!/bin/sh
# GET /cgi-bin/net6 (busybox httpd CGI): the guest's IPv6 view and, on request, one IPv6 probe from the guest, for
# tests. The query is exactly one of:
#   (none)                              the view only
#   ping=<IPv6 address>                 ping -6 -c 2 -W 3 <address>
#   fetch=http://[<IPv6 address>]:<port>/<path>    busybox wget -q -O - (bounded by timeout 10; wget's own -T
#                                       crashes busybox 1.35); [ ] : / may come percent-encoded
# Output (text/plain), one key=value a line: addr6=<eth0's IPv6 addresses, comma-joined, with /len>,
# default6=<the first line of `ip -6 route show default`>, udhcpc6=<running udhcpc6 count>; with a probe then
# exit=<its exit code> and, after a line "output:", what it printed. Anything else: 400 and error=<why>.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
q=$QUERY_STRING

bad() {
  printf 'HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n'
  echo "error=$1"
  exit 0
}

probe=
case "$q" in
  '') ;;
  ping=*)
    v=${q#ping=}
    echo "$v" | grep -qE '^[0-9A-Fa-f:.]{2,45}$' && echo "$v" | grep -q : || bad "ping= takes an IPv6 address (hex digits, colons, dots)"
    probe=ping
    ;;
  fetch=*)
    v=$(echo "${q#fetch=}" | sed 's/%5[Bb]/[/g; s/%5[Dd]/]/g; s/%3[Aa]/:/g; s/%2[Ff]/\//g')
    echo "$v" | grep -qE '^http://\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?/[A-Za-z0-9._/-]*$' \
      || bad "fetch= takes http://[<IPv6 address>]:<port>/<path> (path: letters, digits . _ / -)"
    probe=fetch
    ;;
  *) bad "unknown query: expected ping=<addr> or fetch=<url>" ;;
esac

echo "Content-Type: text/plain"
echo
echo "addr6=$(ip -6 -o addr show dev eth0 | awk '{print $4}' | tr '\n' ',' | sed 's/,$//')"
echo "default6=$(ip -6 route show default | head -n 1)"
echo "udhcpc6=$(pidof udhcpc6 | wc -w)"
case "$probe" in
  ping) o=$(ping -6 -c 2 -W 3 "$v" 2>&1); rc=$? ;;
  fetch) o=$(timeout 10 wget -q -O - "$v" 2>&1); rc=$? ;;
  *) exit 0 ;;
esac
echo "exit=$rc"
echo "output:"
echo "$o"
