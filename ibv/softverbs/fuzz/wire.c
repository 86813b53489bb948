//go:build rdma

// The softverbs wire decoder, compiled into this package so that Go can fuzz it.
#include "../wire.c"
