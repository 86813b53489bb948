package oob

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A small strict JSON reader for the flat objects of the daemon protocol. It decodes
// without reflection and, for strings, into caller-owned buffers, so the notify path does
// not allocate. Unknown members are skipped (nested values included).

type jsonReader struct {
	b []byte
	i int
}

// jsonErr is a decode failure; field is the member it concerns ("" for syntax).
func jsonErr(field, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	if field == "" {
		return &FrameError{Err: ErrBadFrame, Reason: "json: " + reason}
	}
	return &FrameError{Err: ErrBadFrame, Reason: "field " + strconv.Quote(field) + ": " + reason}
}

func (r *jsonReader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

func (r *jsonReader) peek() byte {
	r.ws()
	if r.i >= len(r.b) {
		return 0
	}
	return r.b[r.i]
}

func (r *jsonReader) expect(c byte) error {
	if r.peek() != c {
		if r.i >= len(r.b) {
			return jsonErr("", "unexpected end, want %q", c)
		}
		return jsonErr("", "offset %d: want %q, got %q", r.i, c, r.b[r.i])
	}
	r.i++
	return nil
}

// end checks that only whitespace follows the top-level value (JsonCpp adds "\n").
func (r *jsonReader) end() error {
	r.ws()
	if r.i != len(r.b) {
		return jsonErr("", "offset %d: trailing data after object", r.i)
	}
	return nil
}

// object walks the members of an object, calling member with each key (valid only during
// the call) and leaving r at the start of its value; member must consume the value.
func (r *jsonReader) object(key []byte, member func(key []byte) error) ([]byte, error) {
	if err := r.expect('{'); err != nil {
		return key, err
	}
	if r.peek() == '}' {
		r.i++
		return key, nil
	}
	for {
		if r.peek() != '"' {
			return key, jsonErr("", "offset %d: want member name", r.i)
		}
		var err error
		key, err = r.str("", key[:0])
		if err != nil {
			return key, err
		}
		if err := r.expect(':'); err != nil {
			return key, err
		}
		r.ws()
		if err := member(key); err != nil {
			return key, err
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			return key, nil
		default:
			return key, jsonErr("", "offset %d: want ',' or '}'", r.i)
		}
	}
}

// isNull consumes a null literal if one is next.
func (r *jsonReader) isNull() bool {
	r.ws()
	if len(r.b)-r.i >= 4 && string(r.b[r.i:r.i+4]) == "null" {
		r.i += 4
		return true
	}
	return false
}

func typeName(c byte) string {
	switch {
	case c == '"':
		return "string"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == 't' || c == 'f':
		return "bool"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	case c == 0:
		return "end of input"
	}
	return strconv.QuoteRune(rune(c))
}

// str reads a string value and appends its decoded bytes to dst. Raw bytes that are not
// valid UTF-8 are kept as they are (JsonCpp writes them so).
func (r *jsonReader) str(field string, dst []byte) ([]byte, error) {
	if c := r.peek(); c != '"' {
		return dst, jsonErr(field, "want string, got %s", typeName(c))
	}
	r.i++
	for {
		// Copy the run of plain bytes at once.
		j := r.i
		for j < len(r.b) && r.b[j] != '"' && r.b[j] != '\\' && r.b[j] >= 0x20 {
			j++
		}
		dst = append(dst, r.b[r.i:j]...)
		r.i = j
		if j >= len(r.b) {
			return dst, jsonErr(field, "unterminated string")
		}
		c := r.b[j]
		switch {
		case c == '"':
			r.i++
			return dst, nil
		case c < 0x20:
			return dst, jsonErr(field, "control byte 0x%02x in string", c)
		}
		// Escape.
		if j+1 >= len(r.b) {
			return dst, jsonErr(field, "unterminated escape")
		}
		e := r.b[j+1]
		r.i = j + 2
		switch e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			cp, ok := r.hex4()
			if !ok {
				return dst, jsonErr(field, "bad \\u escape")
			}
			ru := rune(cp)
			if utf16.IsSurrogate(ru) {
				// A pair is \uD8xx\uDCxx; a lone half decodes to U+FFFD.
				save := r.i
				if len(r.b)-r.i >= 6 && r.b[r.i] == '\\' && r.b[r.i+1] == 'u' {
					r.i += 2
					lo, ok := r.hex4()
					if ok {
						if d := utf16.DecodeRune(ru, rune(lo)); d != utf8.RuneError {
							dst = utf8.AppendRune(dst, d)
							continue
						}
					}
				}
				r.i = save
				ru = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, ru)
		default:
			return dst, jsonErr(field, "bad escape \\%c", e)
		}
	}
}

func (r *jsonReader) hex4() (uint16, bool) {
	if len(r.b)-r.i < 4 {
		return 0, false
	}
	var v uint16
	for k := 0; k < 4; k++ {
		c := r.b[r.i+k]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(c)
	}
	r.i += 4
	return v, true
}

// uint reads an unsigned integer in [0, max]. Fractions, exponents and signs are rejected.
func (r *jsonReader) uint(field string, max uint64) (uint64, error) {
	c := r.peek()
	if c == '-' {
		return 0, jsonErr(field, "negative number, want unsigned integer")
	}
	if c < '0' || c > '9' {
		return 0, jsonErr(field, "want number, got %s", typeName(c))
	}
	start := r.i
	var v uint64
	overflow := false
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		d := uint64(r.b[r.i] - '0')
		if v > (1<<64-1-d)/10 {
			overflow = true
		}
		v = v*10 + d
		r.i++
	}
	if r.i-start > 1 && r.b[start] == '0' {
		return 0, jsonErr(field, "leading zero in number")
	}
	if r.i < len(r.b) {
		switch r.b[r.i] {
		case '.', 'e', 'E':
			return 0, jsonErr(field, "want unsigned integer, got fraction or exponent")
		}
	}
	if overflow || v > max {
		return 0, jsonErr(field, "%s out of range 0..%d", r.b[start:r.i], max)
	}
	return v, nil
}

func (r *jsonReader) boolean(field string) (bool, error) {
	r.ws()
	switch {
	case len(r.b)-r.i >= 4 && string(r.b[r.i:r.i+4]) == "true":
		r.i += 4
		return true, nil
	case len(r.b)-r.i >= 5 && string(r.b[r.i:r.i+5]) == "false":
		r.i += 5
		return false, nil
	}
	return false, jsonErr(field, "want bool, got %s", typeName(r.peek()))
}

// skip consumes any one value, checking its syntax. depth bounds nesting.
func (r *jsonReader) skip(depth int) error {
	if depth > 64 {
		return jsonErr("", "nesting too deep")
	}
	switch c := r.peek(); {
	case c == '"':
		_, err := r.skipStr()
		return err
	case c == '{':
		r.i++
		if r.peek() == '}' {
			r.i++
			return nil
		}
		for {
			if _, err := r.skipStr(); err != nil {
				return err
			}
			if err := r.expect(':'); err != nil {
				return err
			}
			if err := r.skip(depth + 1); err != nil {
				return err
			}
			switch r.peek() {
			case ',':
				r.i++
			case '}':
				r.i++
				return nil
			default:
				return jsonErr("", "offset %d: want ',' or '}'", r.i)
			}
		}
	case c == '[':
		r.i++
		if r.peek() == ']' {
			r.i++
			return nil
		}
		for {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
			switch r.peek() {
			case ',':
				r.i++
			case ']':
				r.i++
				return nil
			default:
				return jsonErr("", "offset %d: want ',' or ']'", r.i)
			}
		}
	case c == 't' || c == 'f':
		_, err := r.boolean("")
		return err
	case c == 'n':
		if !r.isNull() {
			return jsonErr("", "offset %d: bad literal", r.i)
		}
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		return r.skipNumber()
	default:
		return jsonErr("", "offset %d: unexpected %s", r.i, typeName(c))
	}
}

// skipStr validates a string without keeping it.
func (r *jsonReader) skipStr() (int, error) {
	if c := r.peek(); c != '"' {
		return 0, jsonErr("", "offset %d: want string, got %s", r.i, typeName(c))
	}
	r.i++
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			r.i++
			return 0, nil
		case c < 0x20:
			return 0, jsonErr("", "control byte 0x%02x in string", c)
		case c == '\\':
			if r.i+1 >= len(r.b) {
				return 0, jsonErr("", "unterminated escape")
			}
			switch r.b[r.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				r.i += 2
			case 'u':
				r.i += 2
				if _, ok := r.hex4(); !ok {
					return 0, jsonErr("", "bad \\u escape")
				}
			default:
				return 0, jsonErr("", "bad escape \\%c", r.b[r.i+1])
			}
		default:
			r.i++
		}
	}
	return 0, jsonErr("", "unterminated string")
}

// strNonEmpty validates a string value and reports whether it is non-empty.
func (r *jsonReader) strNonEmpty(field string) (bool, error) {
	if c := r.peek(); c != '"' {
		return false, jsonErr(field, "want string, got %s", typeName(c))
	}
	start := r.i
	if _, err := r.skipStr(); err != nil {
		return false, err
	}
	return r.i-start > 2, nil
}

// skipNumber accepts the JSON number grammar.
func (r *jsonReader) skipNumber() error {
	start := r.i
	if r.i < len(r.b) && r.b[r.i] == '-' {
		r.i++
	}
	digits := func() int {
		s := r.i
		for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
			r.i++
		}
		return r.i - s
	}
	intStart := r.i
	n := digits()
	if n == 0 || (n > 1 && r.b[intStart] == '0') {
		return jsonErr("", "offset %d: bad number", start)
	}
	if r.i < len(r.b) && r.b[r.i] == '.' {
		r.i++
		if digits() == 0 {
			return jsonErr("", "offset %d: bad number", start)
		}
	}
	if r.i < len(r.b) && (r.b[r.i] == 'e' || r.b[r.i] == 'E') {
		r.i++
		if r.i < len(r.b) && (r.b[r.i] == '+' || r.b[r.i] == '-') {
			r.i++
		}
		if digits() == 0 {
			return jsonErr("", "offset %d: bad number", start)
		}
	}
	return nil
}

// JSON writing: append-style, no reflection.

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Bytes >= 0x80 are copied as they are
// (UTF-8 text, or raw bytes for a Mooncake peer); '"', '\\' and control bytes are escaped.
func appendJSONString[T ~string | ~[]byte](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// jsonObj writes members of one object, handling the commas.
type jsonObj struct {
	b []byte
	n int
}

func (o *jsonObj) key(k string) {
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = append(o.b, '"')
	o.b = append(o.b, k...)
	o.b = append(o.b, '"', ':')
}

func (o *jsonObj) str(k, v string) {
	o.key(k)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObj) bytes(k string, v []byte) {
	o.key(k)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObj) uint(k string, v uint64) {
	o.key(k)
	o.b = strconv.AppendUint(o.b, v, 10)
}

func (o *jsonObj) boolean(k string, v bool) {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

// strMax reads a string value of at most max decoded bytes.
func (r *jsonReader) strMax(field string, dst []byte, max int) ([]byte, error) {
	start := len(dst)
	dst, err := r.str(field, dst)
	if err == nil && len(dst)-start > max {
		return dst, jsonErr(field, "%d bytes, at most %d", len(dst)-start, max)
	}
	return dst, err
}

// refuseCode reads a ts_refuse (or ts_refuse_cause) value: 1..maxRefuseLen bytes of a-z
// and '_'.
func (r *jsonReader) refuseCode(field string, dst []byte) ([]byte, error) {
	dst, err := r.str(field, dst)
	if err == nil && !validRefuseCode(dst) {
		return dst, jsonErr(field, "%q is not 1..%d bytes of a-z and _", dst, maxRefuseLen)
	}
	return dst, err
}

// optUint writes k only when v is not 0 (absent = 0).
func (o *jsonObj) optUint(k string, v uint64) {
	if v != 0 {
		o.uint(k, v)
	}
}

// optStr writes k only when v is not empty (absent = "").
func (o *jsonObj) optStr(k, v string) {
	if v != "" {
		o.str(k, v)
	}
}
