package dnsd

import (
	"encoding/binary"
	"net/netip"

	"github.com/miekg/dns"
)

// The fast path answers the common query (one question, A or AAAA, class IN,
// a name in the mesh zone, at most an EDNS0 OPT record) straight from the
// datagram's bytes into the reply's, with no message unpacked, no record
// built and nothing allocated. Everything else, and anything it is not sure
// of, takes the general path (local), which stays the reference:
// FuzzFastPathAgrees checks that both give the same answer.

const (
	typeA    = 1
	typeAAAA = 28
	typeSOA  = 6
	typeOPT  = 41
	classIN  = 1
)

// fastReply writes to out the reply to the query q from src and returns it
// with its rcode; ok is false when q is not for the fast path, and then out
// means nothing.
func (s *Server) fastReply(ix *Index, q []byte, src netip.Addr, out []byte) (reply []byte, rcode int, ok bool) {
	if len(q) < 12+1+4 {
		return nil, 0, false
	}
	// Header: a standard query (QR 0, opcode 0, TC 0), rcode 0, one
	// question and nothing else but an optional OPT record.
	if q[2]&0xfa != 0 || q[3]&0x0f != 0 ||
		binary.BigEndian.Uint16(q[4:]) != 1 || binary.BigEndian.Uint16(q[6:]) != 0 ||
		binary.BigEndian.Uint16(q[8:]) != 0 || binary.BigEndian.Uint16(q[10:]) > 1 {
		return nil, 0, false
	}
	if !(src.IsLoopback() || src == s.self || s.inAllow(src)) {
		return nil, 0, false // refused, or a refresh may allow it: general path
	}
	// The name, lower-cased into key in its text form ("n1.internal."), for
	// the plain names the index can hold: letters, digits, '-' and '_'.
	var kb [256]byte
	key := kb[:0]
	off := 12
	for {
		if off >= len(q) {
			return nil, 0, false
		}
		l := int(q[off])
		off++
		if l == 0 {
			break
		}
		if l > 63 || off+l > len(q) || len(key)+l+1 > 254 {
			return nil, 0, false // a pointer, an extended label type, or too long
		}
		for _, c := range q[off : off+l] {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			default:
				return nil, 0, false
			}
			key = append(key, c)
		}
		key = append(key, '.')
		off += l
	}
	qend := off + 4
	if len(key) == 0 || qend > len(q) {
		return nil, 0, false
	}
	qtype := binary.BigEndian.Uint16(q[off:])
	if (qtype != typeA && qtype != typeAAAA) || binary.BigEndian.Uint16(q[off+2:]) != classIN {
		return nil, 0, false
	}
	// The OPT record, when there is one: the root name, version 0, no
	// extended rcode, its options exactly filling the rest.
	size, edns, do := dns.MinMsgSize, false, false
	if q[11] == 1 {
		o := q[qend:]
		if len(o) < 11 || o[0] != 0 || binary.BigEndian.Uint16(o[1:]) != typeOPT ||
			o[5] != 0 || o[6] != 0 || 11+int(binary.BigEndian.Uint16(o[9:])) != len(o) || !onlyCookies(o[11:]) {
			return nil, 0, false
		}
		edns, do = true, o[7]&0x80 != 0
		if u := int(binary.BigEndian.Uint16(o[3:])); u > size {
			size = u
		}
	} else if qend != len(q) {
		return nil, 0, false
	}
	// Only names inside the zone: the apex, routed names and everything to
	// forward take the general path, as does ns.DOMAIN when no module has it.
	d := ix.domain
	if len(key) <= len(d) || key[len(key)-len(d)-1] != '.' || string(key[len(key)-len(d):]) != d {
		return nil, 0, false
	}
	addrs, known := ix.getBytes(key)
	if !known && ix.ns.IsValid() && string(key) == "ns."+d || ix.soaWire == nil {
		return nil, 0, false
	}

	out = append(out[:0], q[0], q[1],
		0x80|0x04|q[2]&0x01, // QR, AA, RD copied
		0x80|q[3]&0x10,      // RA, CD copied
		0, 1, 0, 0, 0, 0, 0, 0)
	out = append(out, q[12:qend]...)
	var an uint16
	ttl := s.cfg.TTL
	for _, a := range addrs {
		switch {
		case qtype == typeA && a.Is4():
			b := a.As4()
			out = append(out, 0xc0, 12, 0, typeA, 0, classIN, byte(ttl>>24), byte(ttl>>16), byte(ttl>>8), byte(ttl), 0, 4)
			out = append(out, b[:]...)
			an++
		case qtype == typeAAAA && a.Is6():
			b := a.As16()
			out = append(out, 0xc0, 12, 0, typeAAAA, 0, classIN, byte(ttl>>24), byte(ttl>>16), byte(ttl>>8), byte(ttl), 0, 16)
			out = append(out, b[:]...)
			an++
		}
	}
	binary.BigEndian.PutUint16(out[6:], an)
	rcode = dns.RcodeSuccess
	if an == 0 {
		// NXDOMAIN or NODATA, with the zone's SOA as authority.
		if !known {
			rcode = dns.RcodeNameError
			out[3] |= dns.RcodeNameError
		}
		out = append(out, ix.soaWire...)
		out[9] = 1
	}
	if edns {
		var flags byte
		if do {
			flags = 0x80
		}
		out = append(out, 0, 0, typeOPT, maxQuery>>8, maxQuery&0xff, 0, 0, flags, 0, 0, 0)
		out[11] = 1
	}
	if len(out) > size {
		return nil, 0, false // the general path truncates
	}
	return out, rcode, true
}

// onlyCookies says the OPT record's options are well-formed and all DNS
// cookies (RFC 7873: what dig and resolvers send), whose content the general
// path takes whatever it is. Any other option takes the general path, which
// may refuse it (a malformed one gets no answer there).
func onlyCookies(opts []byte) bool {
	for len(opts) > 0 {
		if len(opts) < 4 || binary.BigEndian.Uint16(opts) != dns.EDNS0COOKIE {
			return false
		}
		n := 4 + int(binary.BigEndian.Uint16(opts[2:]))
		if n > len(opts) {
			return false
		}
		opts = opts[n:]
	}
	return true
}

// packSOA is the zone's SOA record in wire form, uncompressed, so it can be
// appended anywhere in a reply.
func packSOA(ix *Index, ttl uint32) []byte {
	buf := make([]byte, 512)
	n, err := dns.PackRR(ix.soa(ix.domain, ttl), buf, 0, nil, false)
	if err != nil {
		return nil
	}
	return buf[:n]
}
