# Sourced by the start scripts: free loopback ports.
#
# free_port VAR sets VAR to a port the kernel hands out for a bind to 127.0.0.1:0, never the
# same one twice in one script run (it sets a variable instead of printing, because a command
# substitution would run in a subshell and forget the ports already handed out).
used_ports=" "
free_port() {
  # Not `local port`: a caller's variable of that name would be shadowed and never set.
  local _free_port_candidate
  for _ in $(seq 1 50); do
    _free_port_candidate=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    if [[ $used_ports != *" $_free_port_candidate "* ]]; then
      used_ports+="$_free_port_candidate "
      printf -v "$1" '%s' "$_free_port_candidate"
      return 0
    fi
  done
  echo "no free loopback port found" >&2
  return 1
}

# kept_port VAR sets VAR to a free loopback port below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range), never the same one twice in one script run: for a server
# restarted on the same port (restart-shard.sh), whose port must not be handed meanwhile to
# some connection as its local port, as one from the ephemeral range can be.
kept_port() {
  local _kept_port_candidate
  for _ in $(seq 1 50); do
    _kept_port_candidate=$(python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(min(10000, low - 1000), low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
') || return 1
    if [[ -n $_kept_port_candidate && $used_ports != *" $_kept_port_candidate "* ]]; then
      used_ports+="$_kept_port_candidate "
      printf -v "$1" '%s' "$_kept_port_candidate"
      return 0
    fi
  done
  echo "no free loopback port below the ephemeral range found" >&2
  return 1
}
