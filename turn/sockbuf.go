package turn

// DefaultSocketBuffer is Config.SocketBuffer's default: the receive and
// send buffer asked for on the UDP listener and on every allocation's relay
// socket (1 MiB; RELAY_TURN_SOCKET_BUFFER). The kernel's default (208 KiB,
// 212,992 bytes) holds under a hundred full-size datagrams, and relay
// sockets dropped bursts of real WebRTC traffic at it (issue 17).
//
// Memory: Linux reserves buffer memory only for datagrams actually queued,
// so an idle or keeping-up socket costs nothing extra. The worst case is a
// socket whose reader falls behind: the kernel doubles the value asked for
// (for its bookkeeping) and counts each queued datagram's whole allocation
// (truesize) against it, so a relay socket may hold up to 2 MiB of receive
// and 2 MiB of send memory at this setting: 4 MiB per stalled allocation.
// The system-wide net.ipv4.udp_mem limit caps the sum over all sockets.
const DefaultSocketBuffer = 1 << 20
