package soak

import (
	"fmt"
	"strconv"
	"strings"
)

// A soak notify carries its identity in its name, "soak/<sender engine>/<call>/<payload>/
// <size>", so that its message can be anything from 0 bytes to the limit; the message is a
// pattern derived from the payload number, checked on delivery. A handler's answer (a
// stream of its own, agent.go) is named the same under "soak-answer/".

const (
	namePrefix   = "soak"
	answerPrefix = "soak-answer"
)

// NotifyName is the name of call s (payload p, size bytes) of sender from.
func NotifyName(from string, s, p uint64, size int) string {
	return soakName(namePrefix, from, s, p, size)
}

// AnswerName is the name of answer s (payload p, size bytes) of the answering engine from.
func AnswerName(from string, s, p uint64, size int) string {
	return soakName(answerPrefix, from, s, p, size)
}

func soakName(prefix, from string, s, p uint64, size int) string {
	return prefix + "/" + from + "/" + strconv.FormatUint(s, 10) + "/" + strconv.FormatUint(p, 10) + "/" + strconv.Itoa(size)
}

// ParseNotifyName reads what NotifyName or AnswerName wrote; answer says which.
func ParseNotifyName(name string) (from string, s, p uint64, size int, answer bool, err error) {
	f := strings.Split(name, "/")
	if len(f) != 5 || (f[0] != namePrefix && f[0] != answerPrefix) {
		return "", 0, 0, 0, false, fmt.Errorf("name %.80q is not soak/<from>/<s>/<p>/<size> or soak-answer/...", name)
	}
	if err := checkEngine(f[1]); err != nil {
		return "", 0, 0, 0, false, err
	}
	s, err1 := strconv.ParseUint(f[2], 10, 64)
	p, err2 := strconv.ParseUint(f[3], 10, 64)
	size, err3 := strconv.Atoi(f[4])
	if err1 != nil || err2 != nil || err3 != nil || s == 0 || p == 0 || size < 0 || soakName(f[0], f[1], s, p, size) != name {
		return "", 0, 0, 0, false, fmt.Errorf("name %.80q: bad numbers", name)
	}
	return f[1], s, p, size, f[0] == answerPrefix, nil
}

// FillPayload writes payload p's pattern into b.
func FillPayload(b []byte, p uint64) {
	x := uint32(p*2654435761 + 1)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// CheckPayload says what is wrong with msg as payload p of size bytes ("" when nothing).
func CheckPayload(msg []byte, p uint64, size int) string {
	if len(msg) != size {
		return fmt.Sprintf("size %d, sent %d", len(msg), size)
	}
	x := uint32(p*2654435761 + 1)
	for i := range msg {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		if msg[i] != byte(x) {
			return fmt.Sprintf("byte %d differs", i)
		}
	}
	return ""
}
