/** The header a host sends the peer secret in when it forwards a request to the owning host. */
export const PEER_HEADER = 'x-collimate-peer';
