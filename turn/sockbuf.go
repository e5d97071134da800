package turn

// DefaultSocketBuffer is Config.SocketBuffer's default: the receive and
// send buffer asked for on the UDP listener and on every allocation's relay
// socket (1 MiB; RELAY_TURN_SOCKET_BUFFER). The kernel's default (208 KiB,
// 212,992 bytes) holds under a hundred full-size datagrams, and relay
// sockets dropped bursts of real WebRTC traffic at it (issue 17).
//
// Measured on 2 cores (bench/turnbench, Dec 2026; kernel drops on the
// server's sockets, 3 counted rounds of 2 s, 1,200-byte ChannelData, 8
// allocations; coturn 4.6.1 beside it in the same run):
//
//	buffer    16 in flight each     128 in flight each (core saturated)
//	          ours / coturn         ours / coturn
//	208 KiB   3,471 / 0             52,797 / 20,770
//	256 KiB   60 / 0                65,559 / 18,881
//	1 MiB     0 / 0                 3,832 / 20,838
//	4 MiB     0 / 0                 0 / about 10,000 per round
//
// and through two Chromium pages (webrtccompare, browser unpinned, 4
// rounds of 20 MB): 1,831 drops at the old sizes (listener 4 MiB, relay
// sockets the kernel's), 0 at 1 MiB (coturn 490 and 63 in those runs).
// 1 MiB ends the drops of real traffic at a quarter of 4 MiB's worst
// case; 4 MiB only helps a server core already saturated.
//
// Memory: Linux reserves buffer memory only for datagrams actually queued,
// so an idle or keeping-up socket costs nothing extra. The worst case is a
// socket whose reader falls behind: the kernel doubles the value asked for
// (for its bookkeeping) and counts each queued datagram's whole allocation
// (truesize) against it, so a relay socket may hold up to 2 MiB of receive
// and 2 MiB of send memory at this setting: 4 MiB per stalled allocation.
// The system-wide net.ipv4.udp_mem limit caps the sum over all sockets.
const DefaultSocketBuffer = 1 << 20
