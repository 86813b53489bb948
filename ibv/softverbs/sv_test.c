//go:build ignore

/* sv_test: checks of softverbs through the libibverbs API only (any libibverbs program could
 * do the same): modify-QP attribute rules, bad arguments, busy rules, RC delivery (inline,
 * SGE lists, immediate, segmentation, loss recovery), RNR, flush, CQ overrun, retry exceeded
 * on a killed peer process, completion channel and async events, and the faults of the
 * control file; then, in a child with SOFTVERBS_DEVICES=2 SOFTVERBS_PHANTOM=1, several
 * devices: the list, the phantom, traffic between devices, statistics
 * (ibv_read_sysfs_file of hw_counters) and per-device faults (a port down, a cut restored,
 * a device killed and back). Every wait is bounded (generous, for loaded machines) and
 * nothing asserts a tight timing. Run with LD_LIBRARY_PATH pointing at build/softverbs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>
#include "wire.c" /* to forge packets */

static int failures;
static const char *cur_test = "";

struct sv_case {
	const char *name;
	void (*fn)(void);
};
static char ctl_path[256];

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d [%s] %s: ", __FILE__, __LINE__, cur_test, #cond); \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

#define REQUIRE(cond, ...)                                                                         \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			CHECK(cond, __VA_ARGS__);                                                  \
			return;                                                                    \
		}                                                                                  \
	} while (0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

static void set_ctl(const char *content)
{
	FILE *f = fopen(ctl_path, "w");
	if (!f) {
		perror(ctl_path);
		exit(2);
	}
	fputs(content, f);
	fclose(f);
}

enum { BUF = 1 << 20, RECV_BASE = BUF / 2 };

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
};

struct qopts {
	int send_wr, recv_wr, cqe, inline_data, sig_all;
	int timeout, retry_cnt, rnr_retry, min_rnr;
};

static struct qopts defaults(void)
{
	return (struct qopts){.send_wr = 64, .recv_wr = 64, .cqe = 256, .timeout = 14, .retry_cnt = 7,
			      .rnr_retry = 7, .min_rnr = 12};
}

/* open_dev_at opens the device at index i of the list (errno set when it cannot). */
static struct ibv_context *open_dev_at(int i)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n <= i) {
		if (l)
			ibv_free_device_list(l);
		errno = ENODEV;
		return NULL;
	}
	struct ibv_context *c = ibv_open_device(l[i]);
	int e = errno;
	ibv_free_device_list(l);
	errno = e;
	return c;
}


static struct ibv_qp *new_qp(struct side *s, struct qopts o)
{
	struct ibv_qp_init_attr a = {.send_cq = s->scq, .recv_cq = s->rcq, .qp_type = IBV_QPT_RC,
				     .sq_sig_all = o.sig_all,
				     .cap = {.max_send_wr = o.send_wr, .max_recv_wr = o.recv_wr, .max_send_sge = 4,
					     .max_recv_sge = 4, .max_inline_data = o.inline_data}};
	return ibv_create_qp(s->pd, &a);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_LOCAL_WRITE};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static void rtr_attr(struct ibv_qp_attr *a, uint32_t dqpn, int sgid, struct qopts o)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_RTR;
	a->path_mtu = IBV_MTU_1024;
	a->dest_qp_num = dqpn;
	a->rq_psn = 0;
	a->max_dest_rd_atomic = 1;
	a->min_rnr_timer = o.min_rnr;
	a->ah_attr.is_global = 1;
	a->ah_attr.port_num = 1;
	a->ah_attr.grh.hop_limit = 1;
	a->ah_attr.grh.sgid_index = sgid;
}

static const int RTR_MASK = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
static const int RTS_MASK = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_MAX_QP_RD_ATOMIC;

static void rts_attr(struct ibv_qp_attr *a, struct qopts o)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_RTS;
	a->sq_psn = 0;
	a->timeout = o.timeout;
	a->retry_cnt = o.retry_cnt;
	a->rnr_retry = o.rnr_retry;
	a->max_rd_atomic = 1;
}

/* connect takes qp (INIT) to RTS towards dqpn over GID index 3 (RoCE v2 IPv4). */
static int connect_qp(struct ibv_qp *qp, struct ibv_context *ctx, uint32_t dqpn, struct qopts o)
{
	struct ibv_qp_attr a;
	rtr_attr(&a, dqpn, 3, o);
	if (ibv_query_gid(ctx, 1, 3, &a.ah_attr.grh.dgid))
		return -1;
	int rc = ibv_modify_qp(qp, &a, RTR_MASK);
	if (rc)
		return rc;
	rts_attr(&a, o);
	return ibv_modify_qp(qp, &a, RTS_MASK);
}

static int new_side_at(struct side *s, struct qopts o, int dev)
{
	memset(s, 0, sizeof(*s));
	s->ctx = open_dev_at(dev);
	if (!s->ctx)
		return -1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	s->ch = ibv_create_comp_channel(s->ctx);
	s->scq = ibv_create_cq(s->ctx, o.cqe, s, s->ch, 0);
	s->rcq = ibv_create_cq(s->ctx, o.cqe, s, s->ch, 0);
	if (!s->pd || !s->mr || !s->ch || !s->scq || !s->rcq)
		return -1;
	s->qp = new_qp(s, o);
	if (!s->qp || to_init(s->qp))
		return -1;
	return 0;
}

static int new_side(struct side *s, struct qopts o)
{
	return new_side_at(s, o, 0);
}

static void free_side(struct side *s)
{
	if (s->qp && ibv_destroy_qp(s->qp))
		CHECK(0, "destroy qp");
	if (s->scq && ibv_destroy_cq(s->scq))
		CHECK(0, "destroy scq");
	if (s->rcq && ibv_destroy_cq(s->rcq))
		CHECK(0, "destroy rcq");
	if (s->ch && ibv_destroy_comp_channel(s->ch))
		CHECK(0, "destroy channel");
	if (s->mr && ibv_dereg_mr(s->mr))
		CHECK(0, "dereg mr");
	if (s->pd && ibv_dealloc_pd(s->pd))
		CHECK(0, "dealloc pd");
	if (s->ctx && ibv_close_device(s->ctx))
		CHECK(0, "close");
	free(s->buf);
	memset(s, 0, sizeof(*s));
}

static int pair(struct side *a, struct side *b, struct qopts oa, struct qopts ob)
{
	if (new_side(a, oa) || new_side(b, ob))
		return -1;
	if (connect_qp(a->qp, a->ctx, b->qp->qp_num, oa) || connect_qp(b->qp, b->ctx, a->qp->qp_num, ob))
		return -1;
	return 0;
}

static int post_recv(struct side *s, struct ibv_qp *qp, uint64_t id, int off, int len)
{
	struct ibv_sge sg = {(uintptr_t)s->buf + RECV_BASE + off, (uint32_t)len, s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1}, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct side *s, struct ibv_qp *qp, uint64_t id, int off, int len, int flags)
{
	struct ibv_sge sg = {(uintptr_t)s->buf + off, (uint32_t)len, s->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = flags}, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

/* wait_wcs polls n WCs within secs seconds; returns how many it got. */
static int wait_wcs(struct ibv_cq *cq, struct ibv_wc *out, int n, double secs)
{
	int got = 0;
	double end = now_s() + secs;
	while (got < n && now_s() < end) {
		int k = ibv_poll_cq(cq, n - got, out + got);
		if (k < 0)
			return got;
		got += k;
		if (!k)
			sleep_ms(1);
	}
	return got;
}

static int cq_empty_for(struct ibv_cq *cq, int ms)
{
	struct ibv_wc wc;
	double end = now_s() + ms / 1000.0;
	do {
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
		sleep_ms(1);
	} while (now_s() < end);
	return 1;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return (enum ibv_qp_state)-1;
	return a.qp_state;
}

/* next_async waits for an async event of type want (others are acknowledged and skipped). */
static int next_async(struct ibv_context *ctx, enum ibv_event_type want, struct ibv_async_event *ev, double secs)
{
	double end = now_s() + secs;
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	while (now_s() < end) {
		struct pollfd p = {ctx->async_fd, POLLIN, 0};
		if (poll(&p, 1, 100) <= 0)
			continue;
		if (ibv_get_async_event(ctx, ev))
			continue;
		if (ev->event_type == want)
			return 0;
		ibv_ack_async_event(ev);
	}
	return -1;
}

/* ---- tests ---- */

static void test_modify_rules(void)
{
	cur_test = "modify rules";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_qp *qp = new_qp(&a, o);
	REQUIRE(qp, "create qp: %s", strerror(errno));
	CHECK(qp->state == IBV_QPS_RESET && qp_state(qp) == IBV_QPS_RESET, "new QP in RESET");
	struct ibv_qp_attr at;

	rtr_attr(&at, b.qp->qp_num, 3, o);
	ibv_query_gid(a.ctx, 1, 3, &at.ah_attr.grh.dgid);
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "RESET->RTR");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.port_num = 1;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == EINVAL,
	      "RESET->INIT without PKEY_INDEX");
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
					     IBV_QP_SQ_PSN) == EINVAL,
	      "RESET->INIT with SQ_PSN");
	at.port_num = 2;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == EINVAL,
	      "port 2");
	at.port_num = 1;
	at.pkey_index = 1;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == EINVAL,
	      "pkey index 1 on a 1-entry table");
	CHECK(qp_state(qp) == IBV_QPS_RESET, "still RESET");
	CHECK(to_init(qp) == 0, "RESET->INIT");
	CHECK(qp->state == IBV_QPS_INIT, "ibv_qp.state follows");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS) == 0, "INIT->INIT with ACCESS_FLAGS");
	at.cur_qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL, "CUR_STATE not in INIT->INIT");

	rts_attr(&at, o);
	CHECK(ibv_modify_qp(qp, &at, RTS_MASK) == EINVAL, "INIT->RTS");
	const int rtr_req[] = {IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC,
			       IBV_QP_MIN_RNR_TIMER};
	rtr_attr(&at, b.qp->qp_num, 3, o);
	ibv_query_gid(a.ctx, 1, 3, &at.ah_attr.grh.dgid);
	for (size_t i = 0; i < sizeof(rtr_req) / sizeof(rtr_req[0]); i++)
		CHECK(ibv_modify_qp(qp, &at, RTR_MASK & ~rtr_req[i]) == EINVAL, "INIT->RTR without %#x", rtr_req[i]);
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK | IBV_QP_SQ_PSN) == EINVAL, "INIT->RTR with SQ_PSN");
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK | IBV_QP_TIMEOUT) == EINVAL, "INIT->RTR with TIMEOUT");
	/* Address resolution. */
	at.ah_attr.is_global = 0;
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "RoCE AV without GRH");
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.sgid_index = 1; /* fe80:: (not IPv4) with an IPv4-mapped dgid */
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "sgid family differs from dgid");
	at.ah_attr.grh.sgid_index = 5; /* empty entry */
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "empty sgid entry");
	at.ah_attr.grh.sgid_index = 200; /* past the table */
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "sgid index past the table");
	at.ah_attr.grh.sgid_index = 3;
	at.path_mtu = 7;
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "path_mtu 7");
	at.path_mtu = IBV_MTU_1024;
	at.min_rnr_timer = 32;
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == EINVAL, "min_rnr_timer 32");
	at.min_rnr_timer = o.min_rnr;
	CHECK(qp_state(qp) == IBV_QPS_INIT, "still INIT");
	CHECK(ibv_modify_qp(qp, &at, RTR_MASK) == 0, "INIT->RTR");
	CHECK(qp_state(qp) == IBV_QPS_RTR, "RTR");
	/* fe80:: over fe80:: resolves too (sgid 1, dgid index 1 of the peer). */

	const int rts_req[] = {IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY,
			       IBV_QP_MAX_QP_RD_ATOMIC};
	rts_attr(&at, o);
	for (size_t i = 0; i < sizeof(rts_req) / sizeof(rts_req[0]); i++)
		CHECK(ibv_modify_qp(qp, &at, RTS_MASK & ~rts_req[i]) == EINVAL, "RTR->RTS without %#x", rts_req[i]);
	CHECK(ibv_modify_qp(qp, &at, RTS_MASK | IBV_QP_PATH_MTU) == EINVAL, "RTR->RTS with PATH_MTU");
	at.retry_cnt = 8;
	CHECK(ibv_modify_qp(qp, &at, RTS_MASK) == EINVAL, "retry_cnt 8");
	at.retry_cnt = o.retry_cnt;
	at.cur_qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &at, RTS_MASK | IBV_QP_CUR_STATE) == 0, "RTR->RTS (with CUR_STATE)");
	CHECK(qp_state(qp) == IBV_QPS_RTS, "RTS");
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(qp, &at, IBV_QP_STATE | IBV_QP_CAP | IBV_QP_DEST_QPN | IBV_QP_TIMEOUT, &ia) == 0, "query");
	CHECK(at.dest_qp_num == b.qp->qp_num && at.timeout == o.timeout && at.cap.max_send_wr >= 64 &&
		      ia.cap.max_recv_wr >= 64 && ia.qp_type == IBV_QPT_RC && ia.send_cq == a.scq,
	      "query_qp values");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.min_rnr_timer = 3;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0, "RTS->RTS MIN_RNR_TIMER");
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_MIN_RNR_TIMER) == 0, "RTS->RTS without STATE");
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT) == EINVAL, "RTS->RTS TIMEOUT");
	at.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "RTS->INIT");
	at.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PORT) == EINVAL, "RTS->ERR with PORT");
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0, "RTS->ERR");
	at.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "ERR->RTS");
	at.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0, "ERR->RESET");
	CHECK(to_init(qp) == 0, "INIT again");
	at.qp_state = 42;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "state 42");
	CHECK(ibv_modify_qp(qp, NULL, IBV_QP_STATE) == EINVAL, "NULL attr");
	CHECK(ibv_modify_qp(NULL, &at, IBV_QP_STATE) == EINVAL, "NULL qp");

	/* fe80 link-local GIDs (indexes 0/1) route too. */
	struct ibv_qp *q2 = new_qp(&a, o);
	struct ibv_qp *q3 = new_qp(&b, o);
	REQUIRE(q2 && q3 && !to_init(q2) && !to_init(q3), "q2, q3");
	rtr_attr(&at, q3->qp_num, 1, o);
	ibv_query_gid(b.ctx, 1, 1, &at.ah_attr.grh.dgid);
	CHECK(ibv_modify_qp(q2, &at, RTR_MASK) == 0, "RTR over fe80:: RoCE v2");
	at.dest_qp_num = q2->qp_num;
	CHECK(ibv_modify_qp(q3, &at, RTR_MASK) == 0, "RTR over fe80:: RoCE v2 (back)");
	rts_attr(&at, o);
	CHECK(!ibv_modify_qp(q2, &at, RTS_MASK) && !ibv_modify_qp(q3, &at, RTS_MASK), "RTS over fe80");
	CHECK(post_recv(&b, q3, 5, 0, 64) == 0, "recv");
	CHECK(post_send(&a, q2, 6, 0, 32, IBV_SEND_SIGNALED) == 0, "send");
	struct ibv_wc wc;
	CHECK(wait_wcs(b.rcq, &wc, 1, 10) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5, "fe80 delivery");
	CHECK(wait_wcs(a.scq, &wc, 1, 10) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 6, "fe80 ack");
	CHECK(ibv_destroy_qp(q2) == 0 && ibv_destroy_qp(q3) == 0, "destroy q2 q3");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy");
	free_side(&a);
	free_side(&b);
}

static void test_bad_args(void)
{
	cur_test = "bad arguments";
	struct qopts o = defaults();
	struct side s;
	REQUIRE(!new_side(&s, o), "side");
	errno = 0;
	CHECK(ibv_open_device(NULL) == NULL && errno, "open NULL");
	CHECK(ibv_get_device_name(NULL) == NULL, "name NULL");
	errno = 0;
	CHECK(!ibv_create_cq(s.ctx, 0, NULL, NULL, 0) && errno == EINVAL, "cqe 0");
	CHECK(!ibv_create_cq(s.ctx, 1 << 30, NULL, NULL, 0) && errno == EINVAL, "cqe too big");
	CHECK(!ibv_create_cq(s.ctx, 4, NULL, NULL, 1) && errno == EINVAL, "comp_vector 1");
	struct ibv_cq *cq = ibv_create_cq(s.ctx, 4, NULL, NULL, 0);
	CHECK(cq && cq->cqe >= 4, "cqe rounds up");
	CHECK(cq && ibv_destroy_cq(cq) == 0, "destroy");
	CHECK(!ibv_reg_mr(s.pd, s.buf, 0, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL, "mr length 0");
	CHECK(!ibv_reg_mr(s.pd, s.buf, 64, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "REMOTE_WRITE without LOCAL_WRITE");
	CHECK(!ibv_reg_mr(NULL, s.buf, 64, 0) && errno == EINVAL, "mr NULL pd");
	void *hole = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(hole, 8192);
	CHECK(!ibv_reg_mr(s.pd, hole, 8192, 0) && errno == EFAULT, "unmapped memory: %s", strerror(errno));
	struct ibv_qp_init_attr qa = {.send_cq = s.scq, .recv_cq = s.rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 100000, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(!ibv_create_qp(s.pd, &qa) && errno == EINVAL, "max_send_wr too big");
	qa.cap.max_send_wr = 1;
	qa.cap.max_inline_data = 1 << 20;
	CHECK(!ibv_create_qp(s.pd, &qa) && errno == EINVAL, "inline too big");
	qa.cap.max_inline_data = 0;
	qa.qp_type = IBV_QPT_XRC_SEND;
	CHECK(!ibv_create_qp(s.pd, &qa) && errno == EOPNOTSUPP, "XRC");
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = NULL;
	CHECK(!ibv_create_qp(s.pd, &qa) && errno == EINVAL, "no send cq");
	CHECK(!ibv_create_qp(NULL, &qa), "NULL pd");

	struct ibv_port_attr pa;
	CHECK(ibv_query_port(s.ctx, 2, &pa) == EINVAL, "port 2");
	CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET &&
		      pa.gid_tbl_len >= 4 && (pa.active_mtu == IBV_MTU_1024 || pa.active_mtu == IBV_MTU_4096),
	      "port 1");
	union ibv_gid g;
	CHECK(ibv_query_gid(s.ctx, 1, 999, &g) == -1, "gid 999");
	memset(&g, 0xaa, sizeof(g));
	CHECK(ibv_query_gid(s.ctx, 1, 5, &g) == 0 && g.global.interface_id == 0 && g.global.subnet_prefix == 0,
	      "empty gid reads as zero");
	struct ibv_gid_entry ge, tbl[16];
	CHECK(ibv_query_gid_ex(s.ctx, 1, 5, &ge, 0) == ENODATA, "gid_ex empty");
	CHECK(ibv_query_gid_ex(s.ctx, 1, 3, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		      ge.gid.raw[10] == 0xff && ge.gid_index == 3,
	      "gid_ex 3");
	CHECK(ibv_query_gid_ex(s.ctx, 1, 2, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V1, "gid_ex 2");
	CHECK(ibv_query_gid_ex(s.ctx, 1, 0, &ge, 0) == 0 && ge.gid.raw[0] == 0xfe && ge.gid_type == IBV_GID_TYPE_ROCE_V1,
	      "gid_ex 0");
	CHECK(ibv_query_gid_table(s.ctx, tbl, 2, 0) == -EINVAL, "gid table too small");
	CHECK(ibv_query_gid_table(s.ctx, tbl, 16, 0) == 4, "gid table has 4 entries");
	__be16 pkey;
	CHECK(ibv_query_pkey(s.ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "pkey 0");
	CHECK(ibv_query_pkey(s.ctx, 1, 5, &pkey) != 0, "pkey 5");
	/* The attributes of a generic device (rdma-core's tests check them). */
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(s.ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.orig_attr.vendor_id != 0 && dx.orig_attr.vendor_part_id != 0, "vendor_id %#x",
	      dx.orig_attr.vendor_id);
	CHECK(dx.phys_port_cnt_ex == 1 && dx.orig_attr.phys_port_cnt == 1, "phys_port_cnt_ex %u",
	      dx.phys_port_cnt_ex);
	CHECK(dx.orig_attr.atomic_cap == IBV_ATOMIC_HCA && dx.orig_attr.max_qp_rd_atom > 0, "atomic_cap");
	CHECK(ibv_fork_init() == 0, "fork init");
	CHECK(!strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error"), "wc status str");
	CHECK(!strcmp(ibv_wc_status_str(999), "unknown"), "wc status str unknown");
	CHECK(!strcmp(ibv_event_type_str(IBV_EVENT_PORT_ERR), "port error"), "event str");

	/* Post errors name the bad WR (at RTS: before it, every SEND is EINVAL). */
	REQUIRE(connect_qp(s.qp, s.ctx, s.qp->qp_num, defaults()) == 0, "RTS (to itself)");
	struct ibv_sge sg[8];
	for (int i = 0; i < 8; i++)
		sg[i] = (struct ibv_sge){(uintptr_t)s.buf, 8, s.mr->lkey};
	struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = sg, .num_sge = 8, .opcode = IBV_WR_SEND};
	struct ibv_send_wr w1 = {.wr_id = 1, .next = &w2, .sg_list = sg, .num_sge = 1, .opcode = IBV_WR_SEND};
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(s.qp, &w1, &bad) == EINVAL && bad == &w2, "num_sge > max_send_sge");
	w2.num_sge = 1;
	w2.opcode = IBV_WR_BIND_MW;
	CHECK(ibv_post_send(s.qp, &w2, &bad) == EINVAL && bad == &w2, "BIND_MW unsupported");
	w2.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; /* one SGE of 8 bytes */
	CHECK(ibv_post_send(s.qp, &w2, &bad) == 0, "atomic with one 8-byte SGE");
	w2.num_sge = 0;
	CHECK(ibv_post_send(s.qp, &w2, &bad) == EINVAL && bad == &w2, "atomic without an SGE");
	w2.num_sge = 1;
	w2.opcode = IBV_WR_SEND;
	w2.send_flags = IBV_SEND_INLINE; /* max_inline_data is 0 */
	CHECK(ibv_post_send(s.qp, &w2, &bad) == EINVAL && bad == &w2, "inline above max_inline_data");
	struct ibv_recv_wr r = {.wr_id = 3, .sg_list = sg, .num_sge = 8}, *rbad = NULL;
	CHECK(ibv_post_recv(s.qp, &r, &rbad) == EINVAL && rbad == &r, "recv num_sge");

	/* Busy rules. */
	CHECK(ibv_dealloc_pd(s.pd) == EBUSY, "PD with MR and QP");
	CHECK(ibv_destroy_cq(s.scq) == EBUSY, "CQ with a QP");
	CHECK(ibv_destroy_comp_channel(s.ch) == EBUSY, "channel with CQs");
	struct ibv_pd *pd2 = ibv_alloc_pd(s.ctx);
	struct ibv_mr *mr2 = ibv_reg_mr(pd2, s.buf, 4096, 0);
	CHECK(pd2 && mr2 && ibv_dealloc_pd(pd2) == EBUSY, "PD with MR");
	CHECK(ibv_dereg_mr(mr2) == 0 && ibv_dealloc_pd(pd2) == 0, "PD freed after MR");

	/* Non-blocking channels and async fd answer EAGAIN when empty. */
	fcntl(s.ch->fd, F_SETFL, fcntl(s.ch->fd, F_GETFL) | O_NONBLOCK);
	struct ibv_cq *ecq;
	void *ectx;
	errno = 0;
	CHECK(ibv_get_cq_event(s.ch, &ecq, &ectx) == -1 && errno == EAGAIN, "empty channel");
	fcntl(s.ctx->async_fd, F_SETFL, fcntl(s.ctx->async_fd, F_GETFL) | O_NONBLOCK);
	struct ibv_async_event ev;
	errno = 0;
	CHECK(ibv_get_async_event(s.ctx, &ev) == -1 && errno == EAGAIN, "empty async fd");
	free_side(&s);
}

static void test_delivery(void)
{
	cur_test = "delivery";
	struct qopts oa = defaults(), ob = defaults();
	oa.inline_data = 256;
	oa.send_wr = 128;
	ob.recv_wr = 128;
	struct side a, b;
	REQUIRE(!pair(&a, &b, oa, ob), "pair");
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr ia;
	CHECK(!ibv_query_qp(a.qp, &at, IBV_QP_CAP, &ia) && ia.cap.max_inline_data >= 256, "max_inline_data");
	/* Messages of many sizes, up to 100000 bytes (98 packets at MTU 1024), some inline, some
	 * with immediate, some unsignaled, two SGEs each. */
	const int n = 40;
	int sizes[40];
	for (int i = 0; i < n; i++) {
		sizes[i] = i % 4 == 0 ? 100000 - i : i % 4 == 1 ? 7 * i + 1 : i % 4 == 2 ? 1024 * (i % 3 + 1) : 0;
	}
	for (int i = 0; i < n; i++) {
		struct ibv_sge sg[2] = {{(uintptr_t)b.buf + RECV_BASE + i * 100000, 50, b.mr->lkey},
					{(uintptr_t)b.buf + RECV_BASE + i * 100000 + 50, 100000 - 50, b.mr->lkey}};
		if (RECV_BASE + (i + 1) * 100000 > BUF) {
			sg[0].addr = (uintptr_t)b.buf + RECV_BASE;
			sg[1].addr = sg[0].addr + 50;
		}
		struct ibv_recv_wr wr = {.wr_id = 1000 + i, .sg_list = sg, .num_sge = 2}, *bad;
		CHECK(ibv_post_recv(b.qp, &wr, &bad) == 0, "recv %d", i);
	}
	int signaled = 0;
	for (int i = 0; i < n; i++) {
		int sz = sizes[i];
		uint8_t *p = a.buf + (i % 4) * 100000;
		for (int j = 0; j < sz; j++)
			p[j] = (uint8_t)(i * 7 + j);
		struct ibv_sge sg[2] = {{(uintptr_t)p, (uint32_t)(sz / 3), a.mr->lkey},
					{(uintptr_t)p + sz / 3, (uint32_t)(sz - sz / 3), a.mr->lkey}};
		struct ibv_send_wr wr = {.wr_id = i, .sg_list = sg, .num_sge = 2, .opcode = IBV_WR_SEND}, *bad;
		if (i % 3 == 0) {
			wr.opcode = IBV_WR_SEND_WITH_IMM;
			wr.imm_data = htobe32(0xabc00000 + i);
		}
		if (i % 2 == 0) {
			wr.send_flags |= IBV_SEND_SIGNALED;
			signaled++;
		}
		if (sz <= 256 && i % 4 == 1)
			wr.send_flags |= IBV_SEND_INLINE;
		CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "send %d", i);
		if (wr.send_flags & IBV_SEND_INLINE)
			memset(p, 0xee, sz); /* inline data was taken at post time */
		/* Let the ring breathe: b's RECV buffers overlap after 5 messages. */
		struct ibv_wc wc;
		CHECK(wait_wcs(b.rcq, &wc, 1, 20) == 1, "recv wc %d", i);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(1000 + i) && wc.byte_len == (uint32_t)sz &&
			      wc.opcode == IBV_WC_RECV && wc.qp_num == b.qp->qp_num && wc.src_qp == a.qp->qp_num,
		      "recv %d: status %s wr_id %llu len %u", i, ibv_wc_status_str(wc.status),
		      (unsigned long long)wc.wr_id, wc.byte_len);
		if (i % 3 == 0)
			CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0xabc00000u + i, "imm %d", i);
		else
			CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "no imm %d", i);
		uint8_t *r = RECV_BASE + (i + 1) * 100000 > BUF ? b.buf + RECV_BASE : b.buf + RECV_BASE + i * 100000;
		int bad_at = -1;
		for (int j = 0; j < sz && bad_at < 0; j++)
			if (r[j] != (uint8_t)(i * 7 + j))
				bad_at = j;
		CHECK(bad_at < 0, "payload %d differs at byte %d", i, bad_at);
	}
	struct ibv_wc wcs[64];
	int got = wait_wcs(a.scq, wcs, signaled, 20);
	CHECK(got == signaled, "signaled sends %d of %d", got, signaled);
	for (int i = 0; i < got; i++)
		CHECK(wcs[i].status == IBV_WC_SUCCESS && wcs[i].wr_id == (uint64_t)(2 * i) && wcs[i].opcode == IBV_WC_SEND,
		      "send wc %d", i);
	CHECK(cq_empty_for(a.scq, 50), "no WC for unsignaled sends");
	free_side(&a);
	free_side(&b);
}

static void test_rnr(void)
{
	cur_test = "rnr";
	struct qopts oa = defaults(), ob = defaults();
	oa.rnr_retry = 2;
	ob.min_rnr = 1;
	struct side a, b;
	REQUIRE(!pair(&a, &b, oa, ob), "pair");
	CHECK(post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED) == 0, "send 1");
	CHECK(post_send(&a, a.qp, 2, 16, 16, IBV_SEND_SIGNALED) == 0, "send 2");
	struct ibv_wc wc[2];
	CHECK(wait_wcs(a.scq, wc, 2, 20) == 2, "2 WCs");
	CHECK(wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR && wc[0].wr_id == 1, "RNR_RETRY_EXC_ERR: %s",
	      ibv_wc_status_str(wc[0].status));
	CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR && wc[1].wr_id == 2, "flush");
	CHECK(qp_state(a.qp) == IBV_QPS_ERR, "ERR");
	free_side(&a);
	free_side(&b);

	/* rnr_retry 7 retries for ever: a RECV posted late lands. */
	oa.rnr_retry = 7;
	REQUIRE(!pair(&a, &b, oa, ob), "pair");
	CHECK(post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED) == 0, "send");
	CHECK(cq_empty_for(a.scq, 300), "no completion while RNR");
	CHECK(post_recv(&b, b.qp, 9, 0, 16) == 0, "late recv");
	CHECK(wait_wcs(b.rcq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "late recv lands");
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "send completes");
	free_side(&a);
	free_side(&b);
}

static void test_flush(void)
{
	cur_test = "flush on error";
	struct qopts oa = defaults(), ob = defaults();
	ob.min_rnr = 14;
	struct side a, b;
	REQUIRE(!pair(&a, &b, oa, ob), "pair");
	for (int i = 0; i < 5; i++)
		CHECK(post_recv(&a, a.qp, 10 + i, i * 64, 64) == 0, "recv");
	for (int i = 0; i < 3; i++)
		CHECK(post_send(&a, a.qp, 20 + i, 0, 16, i == 1 ? 0 : IBV_SEND_SIGNALED) == 0, "send");
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(a.qp, &at, IBV_QP_STATE) == 0, "to ERR");
	struct ibv_wc wc[8];
	CHECK(wait_wcs(a.rcq, wc, 5, 10) == 5, "5 recv flushes");
	for (int i = 0; i < 5; i++)
		CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id == (uint64_t)(10 + i), "recv flush %d", i);
	CHECK(wait_wcs(a.scq, wc, 3, 10) == 3, "3 send flushes (unsignaled included)");
	for (int i = 0; i < 3; i++)
		CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id == (uint64_t)(20 + i), "send flush %d", i);
	CHECK(post_recv(&a, a.qp, 99, 0, 64) == 0, "recv in ERR");
	CHECK(wait_wcs(a.rcq, wc, 1, 10) == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[0].wr_id == 99, "flushed");
	CHECK(post_send(&a, a.qp, 98, 0, 8, 0) == 0, "send in ERR");
	CHECK(wait_wcs(a.scq, wc, 1, 10) == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[0].wr_id == 98, "flushed");
	free_side(&a);
	free_side(&b);
}

static void test_overrun(void)
{
	cur_test = "cq overrun";
	struct qopts oa = defaults(), ob = defaults();
	ob.cqe = 1;
	struct side a, b;
	REQUIRE(!pair(&a, &b, oa, ob), "pair");
	int n = b.rcq->cqe + 2;
	for (int i = 0; i < n; i++)
		CHECK(post_recv(&b, b.qp, i, 0, 64) == 0, "recv");
	for (int i = 0; i < n; i++)
		CHECK(post_send(&a, a.qp, i, 0, 8, 0) == 0, "send");
	struct ibv_async_event ev;
	REQUIRE(next_async(b.ctx, IBV_EVENT_CQ_ERR, &ev, 20) == 0, "CQ_ERR");
	CHECK(ev.element.cq == b.rcq, "CQ_ERR names the CQ");
	ibv_ack_async_event(&ev);
	CHECK(next_async(b.ctx, IBV_EVENT_QP_FATAL, &ev, 20) == 0 && ev.element.qp == b.qp, "QP_FATAL");
	ibv_ack_async_event(&ev);
	CHECK(qp_state(b.qp) == IBV_QPS_ERR, "QP in ERR");
	free_side(&a);
	free_side(&b);
}

static void test_channel(void)
{
	cur_test = "completion channel";
	struct side a, b;
	REQUIRE(!pair(&a, &b, defaults(), defaults()), "pair");
	for (int i = 0; i < 4; i++)
		post_recv(&b, b.qp, i, i * 64, 64);
	fcntl(b.ch->fd, F_SETFL, fcntl(b.ch->fd, F_GETFL) | O_NONBLOCK);
	struct ibv_cq *cq;
	void *cctx;
	struct ibv_wc wc;
	post_send(&a, a.qp, 1, 0, 8, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(b.rcq, &wc, 1, 10) == 1, "unarmed WC");
	struct pollfd p = {b.ch->fd, POLLIN, 0};
	CHECK(poll(&p, 1, 50) == 0, "unarmed: fd not readable");
	CHECK(ibv_req_notify_cq(b.rcq, 0) == 0, "arm");
	post_send(&a, a.qp, 2, 0, 8, IBV_SEND_SIGNALED);
	CHECK(poll(&p, 1, 10000) == 1, "armed: fd readable");
	CHECK(ibv_get_cq_event(b.ch, &cq, &cctx) == 0 && cq == b.rcq && cctx == &b, "event");
	errno = 0;
	CHECK(ibv_get_cq_event(b.ch, &cq, &cctx) == -1 && errno == EAGAIN, "one arm, one event");
	ibv_ack_cq_events(b.rcq, 1);
	CHECK(wait_wcs(b.rcq, &wc, 1, 10) == 1, "armed WC");
	post_send(&a, a.qp, 3, 0, 8, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(b.rcq, &wc, 1, 10) == 1, "third WC");
	CHECK(poll(&p, 1, 50) == 0, "no second event without a new arm");
	/* Solicited-only arming fires on a solicited SEND only. */
	CHECK(ibv_req_notify_cq(b.rcq, 1) == 0, "arm solicited");
	post_send(&a, a.qp, 4, 0, 8, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(b.rcq, &wc, 1, 10) == 1, "fourth WC");
	CHECK(poll(&p, 1, 50) == 0, "unsolicited: no event");
	post_recv(&b, b.qp, 5, 0, 64);
	post_send(&a, a.qp, 5, 0, 8, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	CHECK(poll(&p, 1, 10000) == 1, "solicited: event");
	CHECK(ibv_get_cq_event(b.ch, &cq, &cctx) == 0, "event");
	ibv_ack_cq_events(cq, 1);
	wait_wcs(b.rcq, &wc, 1, 10);
	struct ibv_wc sw[8];
	wait_wcs(a.scq, sw, 5, 10);
	free_side(&a);
	free_side(&b);
}

/* A consumer busy-polling an empty CQ reads its context's sockets itself, and the progress
 * thread leaves them to it; once the poller stops (arming nothing) the thread must read them
 * again: a SEND to that side then completes, though nobody there polls. Left to a poller
 * that has gone, it would run out of retries (IBV_WC_RETRY_EXC_ERR). */
static void test_poller_handback(void)
{
	cur_test = "busy poller hands back";
	struct qopts o = defaults();
	o.recv_wr = 128;
	struct side a, b;
	REQUIRE(!pair(&a, &b, o, o), "pair");
	struct ibv_wc wc[64];
	const int n = 50;
	for (int i = 0; i <= n; i++)
		CHECK(post_recv(&b, b.qp, i, 0, 64) == 0, "recv");
	/* b busy-polls while a's SENDs arrive: b's poller takes them, b's thread steps aside */
	for (int i = 0; i < n; i++)
		CHECK(post_send(&a, a.qp, i, 0, 64, IBV_SEND_SIGNALED) == 0, "send");
	int got = 0;
	double end = now_s() + 30;
	while (got < n && now_s() < end) {
		int k = ibv_poll_cq(b.rcq, 64, wc);
		CHECK(k >= 0, "poll");
		got += k > 0 ? k : 0;
	}
	CHECK(got == n, "b got %d of %d", got, n);
	CHECK(wait_wcs(a.scq, wc, n, 30) == n, "a's sends");
	/* b goes on polling its empty CQ past the thread's next wake-up (it reads the control
	 * file every 100 ms), which then leaves the sockets to b's poller */
	end = now_s() + 0.25;
	while (now_s() < end)
		CHECK(ibv_poll_cq(b.rcq, 1, wc) == 0, "b's CQ empty");
	/* b stops polling; a's next SEND is read and acknowledged by b's thread */
	CHECK(post_send(&a, a.qp, n, 0, 64, IBV_SEND_SIGNALED) == 0, "send");
	REQUIRE(wait_wcs(a.scq, wc, 1, 30) == 1, "no completion of the SEND to a side nobody polls");
	CHECK(wc[0].status == IBV_WC_SUCCESS, "SEND to a side nobody polls: %s", ibv_wc_status_str(wc[0].status));
	CHECK(wait_wcs(b.rcq, wc, 1, 10) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == (uint64_t)n,
	      "b's RECV of it");
	free_side(&a);
	free_side(&b);
}

static void test_loss(void)
{
	cur_test = "loss recovery";
	/* The default ACK timeout (14: 67 ms, 8 tries): a 4 ms one (8 tries, 34 ms in all)
	 * runs out when a loaded machine stalls the progress threads, without a defect. */
	struct qopts o = defaults();
	o.recv_wr = 128;
	o.send_wr = 128;
	struct side a, b;
	REQUIRE(!pair(&a, &b, o, o), "pair");
	set_ctl("drop_pct=10\n");
	sleep_ms(300); /* the progress threads re-read the file every 100 ms */
	const int n = 100, sz = 3000;
	for (int i = 0; i < n; i++)
		CHECK(post_recv(&b, b.qp, i, (i % 100) * 3000, sz) == 0, "recv");
	for (int i = 0; i < n; i++) {
		memset(a.buf + i * sz, i, sz);
		CHECK(post_send(&a, a.qp, i, i * sz, sz, IBV_SEND_SIGNALED) == 0, "send");
	}
	struct ibv_wc wc[100];
	int got = wait_wcs(b.rcq, wc, n, 60);
	CHECK(got == n, "got %d of %d", got, n);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i && wc[i].byte_len == (uint32_t)sz,
		      "recv %d: %s", i, ibv_wc_status_str(wc[i].status));
	for (int i = 0; i < got; i++) {
		int bad = 0;
		for (int j = 0; j < sz; j++)
			bad += b.buf[RECV_BASE + i * sz + j] != (uint8_t)i;
		CHECK(!bad, "recv %d: %d bytes wrong", i, bad);
	}
	got = wait_wcs(a.scq, wc, n, 60);
	CHECK(got == n, "sends %d of %d", got, n);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i, "send %d", i);
	set_ctl("");
	sleep_ms(300);
	CHECK(cq_empty_for(b.rcq, 50), "nothing placed twice");
	free_side(&a);
	free_side(&b);
}

static void test_faults(void)
{
	cur_test = "faults";
	struct side a, b;
	struct qopts o = defaults();
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_async_event ev;
	struct ibv_port_attr pa;

	set_ctl("port=down\n");
	CHECK(next_async(a.ctx, IBV_EVENT_PORT_ERR, &ev, 10) == 0 && ev.element.port_num == 1, "PORT_ERR");
	ibv_ack_async_event(&ev);
	CHECK(ibv_query_port(a.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN, "port DOWN");
	set_ctl("port=up\n");
	CHECK(next_async(a.ctx, IBV_EVENT_PORT_ACTIVE, &ev, 10) == 0, "PORT_ACTIVE");
	ibv_ack_async_event(&ev);
	CHECK(ibv_query_port(a.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "port ACTIVE");

	struct ibv_qp_attr at;
	rtr_attr(&at, b.qp->qp_num, 3, o);
	ibv_query_gid(a.ctx, 1, 3, &at.ah_attr.grh.dgid);
	set_ctl("rtr_fail=EHOSTUNREACH\n");
	sleep_ms(10);
	CHECK(ibv_modify_qp(a.qp, &at, RTR_MASK) == EHOSTUNREACH, "RTR refused");
	CHECK(qp_state(a.qp) == IBV_QPS_INIT, "still INIT");
	set_ctl("rtr_delay_ms=300\n");
	double t0 = now_s();
	CHECK(ibv_modify_qp(a.qp, &at, RTR_MASK) == 0, "RTR after a delay");
	CHECK(now_s() - t0 >= 0.25, "RTR took %.3f s", now_s() - t0);

	/* Port down: a connected SEND retries, then RETRY_EXC_ERR. */
	set_ctl("");
	o.timeout = 10;
	o.retry_cnt = 2;
	CHECK(connect_qp(b.qp, b.ctx, a.qp->qp_num, o) == 0, "b RTS");
	rts_attr(&at, o);
	CHECK(ibv_modify_qp(a.qp, &at, RTS_MASK) == 0, "a RTS");
	post_recv(&b, b.qp, 1, 0, 64);
	set_ctl("port=down\n");
	CHECK(next_async(a.ctx, IBV_EVENT_PORT_ERR, &ev, 10) == 0, "PORT_ERR");
	ibv_ack_async_event(&ev);
	post_send(&a, a.qp, 7, 0, 16, IBV_SEND_SIGNALED);
	struct ibv_wc wc;
	CHECK(wait_wcs(a.scq, &wc, 1, 30) == 1 && wc.status == IBV_WC_RETRY_EXC_ERR, "retry exceeded on a down port");
	set_ctl("port=up\n");
	CHECK(next_async(a.ctx, IBV_EVENT_PORT_ACTIVE, &ev, 10) == 0, "PORT_ACTIVE");
	ibv_ack_async_event(&ev);

	/* Device fatal. */
	post_recv(&b, b.qp, 2, 64, 64);
	set_ctl("fatal=1\n");
	CHECK(next_async(b.ctx, IBV_EVENT_DEVICE_FATAL, &ev, 10) == 0, "DEVICE_FATAL");
	ibv_ack_async_event(&ev);
	CHECK(qp_state(b.qp) == IBV_QPS_ERR, "QPs in ERR after fatal");
	struct ibv_wc rw[2];
	CHECK(wait_wcs(b.rcq, rw, 2, 10) == 2 && rw[0].status == IBV_WC_WR_FLUSH_ERR, "RECVs flushed after fatal");
	errno = 0;
	CHECK(ibv_alloc_pd(b.ctx) == NULL && errno == EIO, "no new objects after fatal");
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	errno = 0;
	CHECK(ibv_open_device(l[0]) == NULL && errno == EIO, "open refused while fatal");
	ibv_free_device_list(l);
	set_ctl("");
	free_side(&a);
	free_side(&b);
}

/* The peer runs in a child process, which is then killed: the sender retries, then
 * RETRY_EXC_ERR, and the WR after it is flushed. */
static void test_dead_peer(void)
{
	cur_test = "retry exceeded on a killed peer";
	int up[2], down[2];
	REQUIRE(!pipe(up) && !pipe(down), "pipes");
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		struct side b;
		uint32_t qpn = 0, peer = 0;
		if (new_side(&b, defaults()))
			_exit(3);
		qpn = b.qp->qp_num;
		if (write(up[1], &qpn, 4) != 4 || read(down[0], &peer, 4) != 4)
			_exit(4);
		if (connect_qp(b.qp, b.ctx, peer, defaults()) || post_recv(&b, b.qp, 1, 0, 64))
			_exit(5);
		if (write(up[1], &qpn, 4) != 4)
			_exit(6);
		for (;;)
			pause();
	}
	struct side a;
	/* 268 ms a try, 8 tries: the first SEND must succeed on a loaded machine too; the
	 * ones after the kill fail after ~2 s. */
	struct qopts o = defaults();
	o.timeout = 16;
	uint32_t peer = 0;
	REQUIRE(!new_side(&a, o), "side");
	REQUIRE(read(up[0], &peer, 4) == 4, "child qpn");
	uint32_t mine = a.qp->qp_num;
	REQUIRE(write(down[1], &mine, 4) == 4, "send qpn");
	REQUIRE(read(up[0], &peer, 4) == 4, "child ready");
	REQUIRE(connect_qp(a.qp, a.ctx, peer, o) == 0, "connect");
	struct ibv_wc wc[2];
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "first send to the live peer");
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	post_send(&a, a.qp, 2, 0, 16, IBV_SEND_SIGNALED);
	post_send(&a, a.qp, 3, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 2, 30) == 2, "two WCs");
	CHECK(wc[0].status == IBV_WC_RETRY_EXC_ERR && wc[0].wr_id == 2, "RETRY_EXC_ERR: %s",
	      ibv_wc_status_str(wc[0].status));
	CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR && wc[1].wr_id == 3, "flush");
	CHECK(qp_state(a.qp) == IBV_QPS_ERR, "ERR");
	free_side(&a);
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
}

/* Posting and the QP state, as the IB spec's immediate errors and mlx5 (rdma-core 40 on):
 * a RECV in RESET and a SEND before RTS are EINVAL (naming the WR); RECVs posted in INIT and
 * RTR are used once the QP receives; SENDs leave from RTS at the path MTU RTR set (4096 here);
 * back in RESET, both are refused again, and a QP that went to ERR without reaching RTS
 * refuses SENDs. */
static void test_post_before_rts(void)
{
	cur_test = "post and QP state";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_RESET};
	REQUIRE(!ibv_modify_qp(a.qp, &at, IBV_QP_STATE) && !ibv_modify_qp(b.qp, &at, IBV_QP_STATE), "RESET");
	for (int i = 0; i < 12000; i++)
		a.buf[i] = (uint8_t)(i * 13);
	CHECK(post_recv(&b, b.qp, 100, 0, 20000) == EINVAL, "recv in RESET");
	CHECK(post_send(&a, a.qp, 1, 0, 9000, IBV_SEND_SIGNALED) == EINVAL, "send in RESET");
	REQUIRE(!to_init(a.qp) && !to_init(b.qp), "INIT");
	CHECK(post_recv(&b, b.qp, 100, 0, 20000) == 0, "recv in INIT");
	CHECK(post_recv(&b, b.qp, 101, 20000, 20000) == 0, "recv in INIT");
	CHECK(post_send(&a, a.qp, 2, 9000, 3000, IBV_SEND_SIGNALED) == EINVAL, "send in INIT");
	struct ibv_qp_attr r;
	rtr_attr(&r, b.qp->qp_num, 3, o);
	r.path_mtu = IBV_MTU_4096;
	ibv_query_gid(b.ctx, 1, 3, &r.ah_attr.grh.dgid);
	REQUIRE(ibv_modify_qp(a.qp, &r, RTR_MASK) == 0, "a RTR");
	CHECK(post_send(&a, a.qp, 3, 0, 1, IBV_SEND_SIGNALED) == EINVAL, "send in RTR");
	r.dest_qp_num = a.qp->qp_num;
	REQUIRE(ibv_modify_qp(b.qp, &r, RTR_MASK) == 0, "b RTR");
	CHECK(post_recv(&b, b.qp, 102, 40000, 20000) == 0, "recv in RTR");
	struct ibv_wc wc[3];
	CHECK(cq_empty_for(b.rcq, 20), "nothing before RTS");
	rts_attr(&at, o);
	REQUIRE(ibv_modify_qp(a.qp, &at, RTS_MASK) == 0, "a RTS");
	CHECK(post_send(&a, a.qp, 1, 0, 9000, IBV_SEND_SIGNALED) == 0 &&
		      post_send(&a, a.qp, 2, 9000, 3000, IBV_SEND_SIGNALED) == 0 &&
		      post_send(&a, a.qp, 3, 0, 1, IBV_SEND_SIGNALED) == 0,
	      "sends in RTS");
	CHECK(wait_wcs(b.rcq, wc, 3, 20) == 3, "3 RECVs");
	const int len[3] = {9000, 3000, 1};
	const int off[3] = {0, 9000, 0};
	for (int i = 0; i < 3; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(100 + i) &&
			      wc[i].byte_len == (uint32_t)len[i],
		      "recv %d: %s len %u", i, ibv_wc_status_str(wc[i].status), wc[i].byte_len);
		CHECK(!memcmp(b.buf + RECV_BASE + 20000 * i, a.buf + off[i], len[i]), "payload %d", i);
	}
	CHECK(wait_wcs(a.scq, wc, 3, 20) == 3 && wc[0].wr_id == 1 && wc[2].wr_id == 3 &&
		      wc[2].status == IBV_WC_SUCCESS,
	      "3 sends");
	/* ERR after RTS: posts are flushed; back in RESET and in ERR from INIT, refused */
	at.qp_state = IBV_QPS_ERR;
	REQUIRE(!ibv_modify_qp(a.qp, &at, IBV_QP_STATE), "a ERR");
	CHECK(post_send(&a, a.qp, 4, 0, 1, IBV_SEND_SIGNALED) == 0 && wait_wcs(a.scq, wc, 1, 20) == 1 &&
		      wc[0].status == IBV_WC_WR_FLUSH_ERR,
	      "send in ERR after RTS: flushed");
	at.qp_state = IBV_QPS_RESET;
	REQUIRE(!ibv_modify_qp(a.qp, &at, IBV_QP_STATE), "a RESET");
	CHECK(post_recv(&a, a.qp, 5, 0, 16) == EINVAL && post_send(&a, a.qp, 6, 0, 1, 0) == EINVAL,
	      "both refused after RESET");
	REQUIRE(!to_init(a.qp), "INIT again");
	at.qp_state = IBV_QPS_ERR;
	REQUIRE(!ibv_modify_qp(a.qp, &at, IBV_QP_STATE), "a ERR from INIT");
	CHECK(post_send(&a, a.qp, 7, 0, 1, 0) == EINVAL, "send in ERR never having reached RTS");
	CHECK(post_recv(&a, a.qp, 8, 0, 16) == 0 && wait_wcs(a.rcq, wc, 1, 20) == 1 &&
		      wc[0].status == IBV_WC_WR_FLUSH_ERR,
	      "recv in ERR after INIT: flushed");
	free_side(&a);
	free_side(&b);
}

/* ---- several devices (run in a child with SOFTVERBS_DEVICES=2 SOFTVERBS_PHANTOM=1) ---- */

/* rdma-core exports it (IBVERBS_1.0) but declares it in a private header. */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static int read_sysfs(int dev, const char *file, char *buf, size_t n)
{
	int cnt = 0;
	struct ibv_device **l = ibv_get_device_list(&cnt);
	if (!l || dev >= cnt) {
		if (l)
			ibv_free_device_list(l);
		return -1;
	}
	int rc = ibv_read_sysfs_file(l[dev]->ibdev_path, file, buf, n);
	ibv_free_device_list(l);
	return rc;
}

/* counter reads a statistic of device dev; UINT64_MAX when it cannot. */
static uint64_t counter(int dev, const char *name)
{
	char path[128], buf[64];
	snprintf(path, sizeof(path), "ports/1/hw_counters/%s", name);
	if (read_sysfs(dev, path, buf, sizeof(buf)) < 0)
		return UINT64_MAX;
	return strtoull(buf, NULL, 10);
}

/* port_state opens device dev (which makes softverbs read its control file at once) and
 * queries port 1; -1 when it cannot be opened. */
static int port_state(int dev)
{
	struct ibv_context *c = open_dev_at(dev);
	if (!c)
		return -1;
	struct ibv_port_attr pa;
	int st = ibv_query_port(c, 1, &pa) ? -1 : (int)pa.state;
	ibv_close_device(c);
	return st;
}

/* xpair connects a on device da with b on device db. */
static int xpair(struct side *a, int da, struct side *b, int db, struct qopts oa, struct qopts ob)
{
	if (new_side_at(a, oa, da) || new_side_at(b, ob, db))
		return -1;
	if (connect_qp(a->qp, b->ctx, b->qp->qp_num, oa) || connect_qp(b->qp, a->ctx, a->qp->qp_num, ob))
		return -1;
	return 0;
}

static void test_device_list(void)
{
	cur_test = "device list";
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	REQUIRE(l && n == 3, "3 devices (2 and a phantom), got %d", n);
	uint64_t guids[3];
	for (int i = 0; i < 3; i++) {
		char want[32];
		snprintf(want, sizeof(want), "softverbs%d", i);
		CHECK(!strcmp(ibv_get_device_name(l[i]), want), "device %d named %s", i, ibv_get_device_name(l[i]));
		CHECK(ibv_get_device_index(l[i]) == i, "index %d", i);
		guids[i] = ibv_get_device_guid(l[i]);
		struct ibv_context *c = ibv_open_device(l[i]);
		REQUIRE(c, "open %d: %s", i, strerror(errno));
		struct ibv_device_attr da;
		CHECK(!ibv_query_device(c, &da) && da.node_guid == guids[i], "node_guid %d", i);
		struct ibv_port_attr pa;
		CHECK(!ibv_query_port(c, 1, &pa), "query_port %d", i);
		if (i < 2)
			CHECK(pa.state == IBV_PORT_ACTIVE && pa.phys_state == 5, "device %d ACTIVE", i);
		else
			CHECK(pa.state == IBV_PORT_DOWN && pa.phys_state == 2, "phantom DOWN, Polling: %d %d", pa.state,
			      pa.phys_state);
		union ibv_gid g;
		uint8_t ip[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, (uint8_t)(i + 1)};
		CHECK(!ibv_query_gid(c, 1, 3, &g) && !memcmp(g.raw, ip, 16), "device %d GID[3] ::ffff:127.0.0.%d", i, i + 1);
		ibv_close_device(c);
	}
	CHECK(guids[0] != guids[1] && guids[1] != guids[2] && guids[0] != guids[2], "distinct GUIDs");
	ibv_free_device_list(l);

	char buf[64];
	CHECK(read_sysfs(0, "board_id", buf, sizeof(buf)) > 0 && !strcmp(buf, "SOFTVERBS_0001"), "board_id");
	CHECK(read_sysfs(0, "ports/1/state", buf, sizeof(buf)) > 0 && !strcmp(buf, "4: ACTIVE"), "state %s", buf);
	CHECK(read_sysfs(2, "ports/1/state", buf, sizeof(buf)) > 0 && !strcmp(buf, "1: DOWN"), "phantom state %s", buf);
	CHECK(read_sysfs(2, "ports/1/phys_state", buf, sizeof(buf)) > 0 && !strcmp(buf, "2: Polling"), "phys %s", buf);
	errno = 0;
	CHECK(read_sysfs(0, "ports/1/hw_counters/no_such_counter", buf, sizeof(buf)) == -1 && errno == ENOENT,
	      "unknown counter: ENOENT");
	CHECK(counter(1, "local_ack_timeout") != UINT64_MAX, "local_ack_timeout readable");
}

/* Traffic between two devices; the statistics count it. */
static void test_device_traffic(void)
{
	cur_test = "two devices";
	struct side a, b;
	struct qopts o = defaults();
	uint64_t tx0 = counter(0, "tx_packets"), rx1 = counter(1, "rx_packets");
	REQUIRE(!xpair(&a, 0, &b, 1, o, o), "pair across devices");
	struct ibv_qp_attr at;
	rtr_attr(&at, b.qp->qp_num, 3, o);
	ibv_query_gid(b.ctx, 1, 3, &at.ah_attr.grh.dgid);
	for (int i = 0; i < 4; i++)
		CHECK(post_recv(&b, b.qp, i, i * 5000, 5000) == 0, "recv");
	for (int i = 0; i < 4; i++) {
		memset(a.buf + i * 5000, 'a' + i, 5000);
		CHECK(post_send(&a, a.qp, i, i * 5000, 5000, IBV_SEND_SIGNALED) == 0, "send");
	}
	struct ibv_wc wc[4];
	CHECK(wait_wcs(b.rcq, wc, 4, 20) == 4, "4 RECVs");
	for (int i = 0; i < 4; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i && wc[i].byte_len == 5000 &&
			      b.buf[RECV_BASE + i * 5000 + 4999] == 'a' + i,
		      "recv %d", i);
	CHECK(wait_wcs(a.scq, wc, 4, 20) == 4 && wc[3].status == IBV_WC_SUCCESS, "4 sends");
	CHECK(counter(0, "tx_packets") - tx0 >= 20, "device 0 sent 4 x 5 packets");
	CHECK(counter(1, "rx_packets") - rx1 >= 20, "device 1 received them");
	free_side(&a);
	free_side(&b);

	/* RNR NAKs are counted on both ends: 1 + rnr_retry of them for one failed SEND. */
	struct qopts oa = defaults(), ob = defaults();
	oa.rnr_retry = 3;
	ob.min_rnr = 1;
	REQUIRE(!xpair(&a, 0, &b, 1, oa, ob), "pair");
	uint64_t sent = counter(1, "rnr_nak_sent"), recv = counter(0, "rnr_nak_received");
	uint64_t exc = counter(0, "rnr_retry_exceeded");
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR, "RNR_RETRY_EXC_ERR");
	CHECK(counter(1, "rnr_nak_sent") - sent == 4, "RNR NAKs sent: %llu",
	      (unsigned long long)(counter(1, "rnr_nak_sent") - sent));
	CHECK(counter(0, "rnr_nak_received") - recv == 4, "RNR NAKs received");
	CHECK(counter(0, "rnr_retry_exceeded") - exc == 1, "rnr_retry_exceeded");
	free_side(&a);
	free_side(&b);
}

/* The faults of one device, through `<device>.key` lines of the control file: its port
 * down cuts what it carries, and only it, then comes back; its fatal error kills its
 * contexts, and only its, and it then opens again for new ones. */
static void test_device_faults(void)
{
	cur_test = "per-device faults";
	struct side a, b, c;
	struct qopts o = defaults();
	o.timeout = 10;
	o.retry_cnt = 2;
	struct ibv_async_event ev;
	struct ibv_wc wc[2];
	REQUIRE(!xpair(&a, 0, &b, 1, o, o), "pair");
	post_recv(&b, b.qp, 1, 0, 64);

	/* Port of device 1 down: PORT_ERR there, not on device 0; a SEND from 0 retries (each
	 * expiry counted), then RETRY_EXC_ERR. */
	set_ctl("softverbs1.port=down\n");
	CHECK(port_state(1) == IBV_PORT_DOWN, "device 1 DOWN at once after an open");
	CHECK(port_state(0) == IBV_PORT_ACTIVE, "device 0 still ACTIVE");
	CHECK(next_async(b.ctx, IBV_EVENT_PORT_ERR, &ev, 10) == 0, "PORT_ERR on device 1");
	ibv_ack_async_event(&ev);
	uint64_t t0 = counter(0, "local_ack_timeout"), x0 = counter(0, "retry_exceeded");
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	post_send(&a, a.qp, 2, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 2, 30) == 2 && wc[0].status == IBV_WC_RETRY_EXC_ERR &&
		      wc[1].status == IBV_WC_WR_FLUSH_ERR,
	      "RETRY_EXC_ERR, then flushed: %s", ibv_wc_status_str(wc[0].status));
	CHECK(counter(0, "local_ack_timeout") - t0 == 3, "1 + retry_cnt ACK timeouts: %llu",
	      (unsigned long long)(counter(0, "local_ack_timeout") - t0));
	CHECK(counter(0, "retry_exceeded") - x0 == 1, "retry_exceeded");
	CHECK(next_async(a.ctx, IBV_EVENT_PORT_ERR, &ev, 0.3) != 0, "no PORT_ERR on device 0");
	CHECK(cq_empty_for(b.rcq, 10), "nothing placed on device 1");
	set_ctl("");
	CHECK(port_state(1) == IBV_PORT_ACTIVE, "device 1 ACTIVE again");
	CHECK(next_async(b.ctx, IBV_EVENT_PORT_ACTIVE, &ev, 10) == 0, "PORT_ACTIVE on device 1");
	ibv_ack_async_event(&ev);
	free_side(&a);
	free_side(&b);

	/* A cut restored: the SEND lost meanwhile is retransmitted and placed once. Its
	 * retries (268 ms a try, 8 tries) outlast the restore on a loaded machine. */
	struct qopts ok = defaults();
	ok.timeout = 16;
	REQUIRE(!xpair(&a, 0, &b, 1, ok, ok), "pair");
	post_recv(&b, b.qp, 1, 0, 64);
	post_recv(&b, b.qp, 2, 64, 64);
	set_ctl("softverbs0.port=down\nsoftverbs1.port=down\n");
	CHECK(port_state(0) == IBV_PORT_DOWN && port_state(1) == IBV_PORT_DOWN, "both DOWN");
	t0 = counter(0, "local_ack_timeout");
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	double end = now_s() + 10;
	while (counter(0, "local_ack_timeout") == t0 && now_s() < end)
		sleep_ms(1);
	CHECK(counter(0, "local_ack_timeout") > t0, "a retransmission while cut");
	set_ctl("");
	CHECK(port_state(0) == IBV_PORT_ACTIVE && port_state(1) == IBV_PORT_ACTIVE, "both ACTIVE");
	CHECK(wait_wcs(b.rcq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 1, "placed");
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "acknowledged");
	post_send(&a, a.qp, 2, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(b.rcq, wc, 1, 20) == 1 && wc[0].wr_id == 2, "the next SEND in the next RECV");
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "acknowledged");
	/* (The two ends' PORT_ERR and PORT_ACTIVE events stay queued; free_side drops them.) */
	free_side(&a);
	free_side(&b);

	/* Device 1 dies. The first SEND must succeed: the long budget again. */
	REQUIRE(!xpair(&a, 0, &b, 1, ok, ok), "pair");
	post_recv(&b, b.qp, 1, 0, 64);
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "first SEND");
	set_ctl("softverbs1.fatal=1\n");
	errno = 0;
	CHECK(open_dev_at(1) == NULL && errno == EIO, "device 1 does not open while fatal");
	struct ibv_context *c0 = open_dev_at(0);
	CHECK(c0 != NULL, "device 0 opens");
	if (c0)
		ibv_close_device(c0);
	CHECK(next_async(b.ctx, IBV_EVENT_DEVICE_FATAL, &ev, 10) == 0, "DEVICE_FATAL on device 1");
	ibv_ack_async_event(&ev);
	CHECK(qp_state(b.qp) == IBV_QPS_ERR, "device 1's QP in ERR");
	post_send(&a, a.qp, 2, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1 && wc[0].status == IBV_WC_RETRY_EXC_ERR, "RETRY_EXC_ERR to a dead device");
	CHECK(next_async(a.ctx, IBV_EVENT_DEVICE_FATAL, &ev, 0.2) != 0, "device 0 lives");
	/* Back for new contexts; the old one stays dead. */
	set_ctl("");
	errno = 0;
	CHECK(ibv_alloc_pd(b.ctx) == NULL && errno == EIO, "a context of the dead device stays dead");
	free_side(&a);
	REQUIRE(!xpair(&a, 0, &c, 1, ok, ok), "a new context on device 1 works");
	post_recv(&c, c.qp, 1, 0, 64);
	post_send(&a, a.qp, 1, 0, 16, IBV_SEND_SIGNALED);
	CHECK(wait_wcs(c.rcq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "delivered to the new context");
	CHECK(wait_wcs(a.scq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS, "acknowledged");
	free_side(&a);
	free_side(&b);
	free_side(&c);
}

static void run_tests(const struct sv_case *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int before = failures;
		double t0 = now_s();
		t[i].fn();
		printf("%s %s (%.2fs)\n", failures == before ? "ok  " : "FAIL", t[i].name, now_s() - t0);
		fflush(stdout);
	}
}

/* A shared receive queue: two QPs take RECVs from it in order, the limit event fires once,
 * a QP in ERR leaves the SRQ's RECVs to the other (QP_LAST_WQE_REACHED), busy rules. */
static void test_srq(void)
{
	cur_test = "srq";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_srq_init_attr si = {.attr = {.max_wr = 16, .max_sge = 2}};
	struct ibv_srq *srq = ibv_create_srq(b.pd, &si);
	REQUIRE(srq && si.attr.max_wr >= 16, "create_srq");
	struct ibv_qp *bq[2], *aq[2];
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr qa = {.send_cq = b.scq, .recv_cq = b.rcq, .srq = srq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 16, .max_send_sge = 1, .max_recv_wr = 16,
						      .max_recv_sge = 1}};
		bq[i] = ibv_create_qp(b.pd, &qa);
		aq[i] = new_qp(&a, o);
		REQUIRE(bq[i] && aq[i] && qa.cap.max_recv_wr == 0, "QPs");
		REQUIRE(!to_init(bq[i]) && !to_init(aq[i]), "INIT");
		REQUIRE(!connect_qp(aq[i], a.ctx, bq[i]->qp_num, o) && !connect_qp(bq[i], b.ctx, aq[i]->qp_num, o),
			"connect");
	}
	CHECK(post_recv(&b, bq[0], 99, 0, 64) == EINVAL, "post_recv on an SRQ QP");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "SRQ with QPs");
	for (int i = 0; i < 8; i++) {
		struct ibv_sge sg = {(uintptr_t)b.buf + RECV_BASE + i * 64, 64, b.mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sg, .num_sge = 1}, *bad;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "post_srq_recv %d", i);
	}
	struct ibv_srq_attr sa = {.srq_limit = 5};
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "arm limit 5");
	sa.max_wr = 64;
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == EINVAL, "no resize");
	struct ibv_wc wc[2];
	for (int k = 0; k < 2; k++) {
		for (int j = 0; j < 2; j++)
			CHECK(post_send(&a, aq[k], 10 * k + j, 0, 32, IBV_SEND_SIGNALED) == 0, "send");
		CHECK(wait_wcs(b.rcq, wc, 2, 30) == 2, "2 RECVs");
		for (int j = 0; j < 2; j++)
			CHECK(wc[j].status == IBV_WC_SUCCESS && wc[j].wr_id == (uint64_t)(2 * k + j) &&
				      wc[j].qp_num == bq[k]->qp_num && wc[j].byte_len == 32,
			      "QP %d RECV %d: wr_id %llu", k, j, (unsigned long long)wc[j].wr_id);
		CHECK(wait_wcs(a.scq, wc, 2, 30) == 2, "2 SENDs");
	}
	struct ibv_async_event ev;
	CHECK(next_async(b.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &ev, 10) == 0 && ev.element.srq == srq, "limit event");
	ibv_ack_async_event(&ev);
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0 && sa.max_wr >= 16, "limit disarmed");
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(bq[0], &at, IBV_QP_STATE) == 0, "QP 0 to ERR");
	CHECK(next_async(b.ctx, IBV_EVENT_QP_LAST_WQE_REACHED, &ev, 10) == 0 && ev.element.qp == bq[0],
	      "LAST_WQE_REACHED");
	ibv_ack_async_event(&ev);
	CHECK(cq_empty_for(b.rcq, 20), "the SRQ's RECVs are not flushed");
	CHECK(post_send(&a, aq[1], 30, 0, 16, IBV_SEND_SIGNALED) == 0, "send");
	CHECK(wait_wcs(b.rcq, wc, 1, 30) == 1 && wc[0].wr_id == 4 && wc[0].qp_num == bq[1]->qp_num,
	      "the other QP takes the next RECV");
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1, "send done");
	for (int i = 0; i < 2; i++)
		CHECK(!ibv_destroy_qp(bq[i]) && !ibv_destroy_qp(aq[i]), "destroy QPs");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy SRQ");
	free_side(&a);
	free_side(&b);
}

/* ---- RDMA WRITE, READ, atomics ---- */

enum { RBUF = 256 * 1024 };

static int set_access(struct ibv_qp *qp, int flags)
{
	struct ibv_qp_attr a = {.qp_access_flags = (unsigned)flags};
	return ibv_modify_qp(qp, &a, IBV_QP_ACCESS_FLAGS);
}

static const int REMOTE_ALL = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC;

static int post_rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, struct ibv_sge *sg, int nsge,
		     uint64_t raddr, uint32_t rkey, uint32_t imm)
{
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = sg, .num_sge = nsge, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = imm}, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static int post_atomic(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, struct ibv_sge *sg, uint64_t raddr,
		       uint32_t rkey, uint64_t cmp_add, uint64_t swap)
{
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = sg, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = cmp_add;
	wr.wr.atomic.swap = swap;
	return ibv_post_send(qp, &wr, &bad);
}

static int one_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return wait_wcs(cq, wc, 1, 30) == 1;
}

static void test_rdma(void)
{
	cur_test = "rdma";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!pair(&a, &b, o, o), "pair");
	REQUIRE(!set_access(a.qp, REMOTE_ALL) && !set_access(b.qp, REMOTE_ALL), "access flags at RTS");
	uint8_t *rbuf = calloc(1, RBUF);
	struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, RBUF, REMOTE_ALL);
	REQUIRE(rbuf && rmr, "remote MR");
	uint64_t rva = (uintptr_t)rbuf;
	struct ibv_wc wc;

	/* WRITE: 100000 bytes, 98 packets at MTU 1024, no RECV used. */
	for (int i = 0; i < 100000; i++)
		a.buf[i] = (uint8_t)(i * 7 + 1);
	struct ibv_sge sg = {(uintptr_t)a.buf, 100000, a.mr->lkey};
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE, 1, &sg, 1, rva + 1000, rmr->rkey, 0) == 0, "post WRITE");
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE &&
		      wc.wr_id == 1 && wc.byte_len == 100000,
	      "WRITE completes: %s op %d", ibv_wc_status_str(wc.status), wc.opcode);
	CHECK(!memcmp(rbuf + 1000, a.buf, 100000), "WRITE placed");
	CHECK(cq_empty_for(b.rcq, 20), "a WRITE takes no RECV");

	/* WRITE with immediate: RNR until a RECV is posted, then RECV_RDMA_WITH_IMM. */
	memset(a.buf + 200000, 0x5c, 5000);
	sg = (struct ibv_sge){(uintptr_t)a.buf + 200000, 5000, a.mr->lkey};
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, &sg, 1, rva + 120000, rmr->rkey, htonl(0xabcd)) == 0,
	      "post WRITE_WITH_IMM");
	CHECK(cq_empty_for(a.scq, 50), "no RECV: not complete (RNR)");
	CHECK(post_recv(&b, b.qp, 77, 0, 0) == 0, "recv");
	CHECK(one_wc(b.rcq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      wc.wr_id == 77 && wc.byte_len == 5000 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
		      wc.imm_data == htonl(0xabcd),
	      "RECV_RDMA_WITH_IMM: op %d len %u", wc.opcode, wc.byte_len);
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 2,
	      "WRITE_WITH_IMM completes");
	CHECK(rbuf[120000] == 0x5c && rbuf[124999] == 0x5c && rbuf[125000] == 0, "WRITE_WITH_IMM placed");

	/* READ: 70000 bytes into two SGEs. */
	struct ibv_sge two[2] = {{(uintptr_t)a.buf + 300000, 30000, a.mr->lkey},
				 {(uintptr_t)a.buf + 400000, 40000, a.mr->lkey}};
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_READ, 3, two, 2, rva + 1000, rmr->rkey, 0) == 0, "post READ");
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 3 &&
		      wc.byte_len == 70000,
	      "READ completes: %s", ibv_wc_status_str(wc.status));
	CHECK(!memcmp(a.buf + 300000, rbuf + 1000, 30000) && !memcmp(a.buf + 400000, rbuf + 31000, 40000),
	      "READ placed");

	/* A chain of WRITEs, READs and SENDs completes in order. */
	CHECK(post_recv(&b, b.qp, 88, 0, 64) == 0, "recv");
	for (int i = 0; i < 8; i++) {
		struct ibv_sge s1 = {(uintptr_t)a.buf + 600000 + i * 3000, 3000, a.mr->lkey};
		if (i == 7)
			CHECK(post_send(&a, a.qp, 100 + i, 0, 16, IBV_SEND_SIGNALED) == 0, "send");
		else
			CHECK(post_rdma(a.qp, i % 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, 100 + i, &s1, 1,
					rva + 150000 + i * 3000, rmr->rkey, 0) == 0,
			      "post %d", i);
	}
	struct ibv_wc ws[8];
	CHECK(wait_wcs(a.scq, ws, 8, 30) == 8, "8 WCs");
	for (int i = 0; i < 8; i++)
		CHECK(ws[i].status == IBV_WC_SUCCESS && ws[i].wr_id == (uint64_t)(100 + i) &&
			      ws[i].opcode == (i == 7 ? IBV_WC_SEND : i % 2 ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE),
		      "chain %d: %s op %d", i, ibv_wc_status_str(ws[i].status), ws[i].opcode);
	CHECK(one_wc(b.rcq, &wc) && wc.wr_id == 88, "the SEND after them");

	/* Atomics on a remote u64, host order; the original value comes back. */
	uint64_t *rv = (uint64_t *)(rbuf + 8), *lv = (uint64_t *)(a.buf + 500000);
	*rv = 5;
	struct ibv_sge s8 = {(uintptr_t)lv, 8, a.mr->lkey};
	CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 4, &s8, rva + 8, rmr->rkey, 3, 0) == 0, "post FETCH_ADD");
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD && wc.byte_len == 8,
	      "FETCH_ADD completes");
	CHECK(*lv == 5 && *rv == 8, "FETCH_ADD: got %llu, now %llu", (unsigned long long)*lv, (unsigned long long)*rv);
	CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, 5, &s8, rva + 8, rmr->rkey, 8, 100) == 0, "post CMP_SWP");
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP, "CMP_SWP completes");
	CHECK(*lv == 8 && *rv == 100, "CMP_SWP swapped");
	CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, 6, &s8, rva + 8, rmr->rkey, 7, 1) == 0, "post CMP_SWP");
	CHECK(one_wc(a.scq, &wc) && wc.status == IBV_WC_SUCCESS, "CMP_SWP completes");
	CHECK(*lv == 100 && *rv == 100, "CMP_SWP compare failed: unchanged");

	/* Zero-length WRITE and READ: the rkey is not checked. */
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE, 7, NULL, 0, 0, 0xdead, 0) == 0 &&
		      post_rdma(a.qp, IBV_WR_RDMA_READ, 8, NULL, 0, 0, 0xdead, 0) == 0,
	      "post zero-length");
	CHECK(wait_wcs(a.scq, ws, 2, 30) == 2 && ws[0].status == IBV_WC_SUCCESS && ws[1].status == IBV_WC_SUCCESS,
	      "zero-length complete");
	CHECK(qp_state(a.qp) == IBV_QPS_RTS && qp_state(b.qp) == IBV_QPS_RTS, "both still RTS");
	ibv_dereg_mr(rmr);
	free(rbuf);
	free_side(&a);
	free_side(&b);
}

/* Each remote error: the requester's WC, the WR after it flushed, the responder's QP in ERR
 * (with QP_ACCESS_ERR for access errors). */
static void test_rdma_errors(void)
{
	cur_test = "rdma errors";
	enum { BAD_RKEY, PAST_END, MR_NO_WRITE, QP_NO_READ, MISALIGNED, LOCAL_NO_WRITE, NCASE };
	static const char *const names[NCASE] = {"bad rkey", "READ past the MR", "MR without REMOTE_WRITE",
						 "QP without REMOTE_READ", "misaligned atomic",
						 "READ into an MR without LOCAL_WRITE"};
	for (int k = 0; k < NCASE; k++) {
		struct qopts o = defaults();
		struct side a, b;
		REQUIRE(!pair(&a, &b, o, o), "pair");
		REQUIRE(!set_access(b.qp, k == QP_NO_READ ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : REMOTE_ALL),
			"access");
		uint8_t *rbuf = calloc(1, 65536);
		struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, 65536,
						k == MR_NO_WRITE ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ : REMOTE_ALL);
		struct ibv_mr *ro = ibv_reg_mr(a.pd, a.buf + 800000, 4096, 0);
		REQUIRE(rbuf && rmr && ro, "MRs");
		uint64_t rva = (uintptr_t)rbuf;
		struct ibv_sge sg = {(uintptr_t)a.buf, 2000, a.mr->lkey};
		struct ibv_sge s8 = {(uintptr_t)a.buf, 8, a.mr->lkey};
		struct ibv_sge sro = {(uintptr_t)a.buf + 800000, 2000, ro->lkey};
		int rc = -1;
		enum ibv_wc_status want = IBV_WC_REM_ACCESS_ERR;
		switch (k) {
		case BAD_RKEY:
			rc = post_rdma(a.qp, IBV_WR_RDMA_WRITE, 1, &sg, 1, rva, rmr->rkey + 1, 0);
			break;
		case PAST_END:
			rc = post_rdma(a.qp, IBV_WR_RDMA_READ, 1, &sg, 1, rva + 65536 - 1000, rmr->rkey, 0);
			break;
		case MR_NO_WRITE:
			rc = post_rdma(a.qp, IBV_WR_RDMA_WRITE, 1, &sg, 1, rva, rmr->rkey, 0);
			break;
		case QP_NO_READ:
			rc = post_rdma(a.qp, IBV_WR_RDMA_READ, 1, &sg, 1, rva, rmr->rkey, 0);
			break;
		case MISALIGNED:
			rc = post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, &s8, rva + 4, rmr->rkey, 1, 0);
			want = IBV_WC_REM_INV_REQ_ERR;
			break;
		case LOCAL_NO_WRITE:
			rc = post_rdma(a.qp, IBV_WR_RDMA_READ, 1, &sro, 1, rva, rmr->rkey, 0);
			want = IBV_WC_LOC_PROT_ERR;
			break;
		}
		CHECK(rc == 0, "%s: post", names[k]);
		CHECK(post_send(&a, a.qp, 2, 0, 16, IBV_SEND_SIGNALED) == 0, "%s: post the next", names[k]);
		struct ibv_wc ws[2];
		CHECK(wait_wcs(a.scq, ws, 2, 30) == 2, "%s: two WCs", names[k]);
		CHECK(ws[0].wr_id == 1 && ws[0].status == want, "%s: %s, want %s", names[k], ibv_wc_status_str(ws[0].status),
		      ibv_wc_status_str(want));
		CHECK(ws[1].wr_id == 2 && ws[1].status == IBV_WC_WR_FLUSH_ERR, "%s: next flushed", names[k]);
		CHECK(qp_state(a.qp) == IBV_QPS_ERR, "%s: requester ERR", names[k]);
		if (k != LOCAL_NO_WRITE) {
			double end = now_s() + 10;
			while (qp_state(b.qp) != IBV_QPS_ERR && now_s() < end)
				sleep_ms(1);
			CHECK(qp_state(b.qp) == IBV_QPS_ERR, "%s: responder ERR", names[k]);
			struct ibv_async_event ev;
			if (want == IBV_WC_REM_ACCESS_ERR) {
				CHECK(next_async(b.ctx, IBV_EVENT_QP_ACCESS_ERR, &ev, 10) == 0 && ev.element.qp == b.qp,
				      "%s: QP_ACCESS_ERR on the responder", names[k]);
				ibv_ack_async_event(&ev);
			}
		} else {
			CHECK(qp_state(b.qp) == IBV_QPS_RTS, "%s: responder untouched", names[k]);
		}
		ibv_dereg_mr(ro);
		ibv_dereg_mr(rmr);
		free(rbuf);
		free_side(&a);
		free_side(&b);
	}
}

/* 10 % loss: WRITEs and READs arrive whole, atomics are executed once each (a duplicate
 * request gets the saved response). */
static void test_rdma_loss(void)
{
	cur_test = "rdma loss";
	struct qopts o = defaults();
	o.send_wr = 128;
	struct side a, b;
	REQUIRE(!pair(&a, &b, o, o), "pair");
	REQUIRE(!set_access(b.qp, REMOTE_ALL), "access");
	uint8_t *rbuf = calloc(1, RBUF);
	struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, RBUF, REMOTE_ALL);
	REQUIRE(rbuf && rmr, "remote MR");
	uint64_t rva = (uintptr_t)rbuf;
	set_ctl("drop_pct=10\n");
	sleep_ms(300);
	const int n = 10, sz = 20000, na = 10;
	for (int i = 0; i < n * sz; i++)
		a.buf[i] = (uint8_t)(i * 11 + 3);
	for (int i = 0; i < n; i++) {
		struct ibv_sge s = {(uintptr_t)a.buf + i * sz, sz, a.mr->lkey};
		CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE, i, &s, 1, rva + i * sz, rmr->rkey, 0) == 0, "write");
	}
	for (int i = 0; i < n; i++) {
		struct ibv_sge s = {(uintptr_t)a.buf + 300000 + i * sz, sz, a.mr->lkey};
		CHECK(post_rdma(a.qp, IBV_WR_RDMA_READ, n + i, &s, 1, rva + i * sz, rmr->rkey, 0) == 0, "read");
	}
	uint64_t *ctr = (uint64_t *)(rbuf + RBUF - 8);
	for (int i = 0; i < na; i++) {
		struct ibv_sge s = {(uintptr_t)a.buf + 600000 + i * 8, 8, a.mr->lkey};
		CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 2 * n + i, &s, rva + RBUF - 8, rmr->rkey, 1, 0) == 0,
		      "fetch_add");
	}
	struct ibv_wc ws[2 * 10 + 10];
	int got = wait_wcs(a.scq, ws, 2 * n + na, 120);
	CHECK(got == 2 * n + na, "got %d of %d", got, 2 * n + na);
	for (int i = 0; i < got; i++)
		CHECK(ws[i].status == IBV_WC_SUCCESS && ws[i].wr_id == (uint64_t)i, "wc %d: %s", i,
		      ibv_wc_status_str(ws[i].status));
	set_ctl("");
	sleep_ms(300);
	CHECK(!memcmp(rbuf, a.buf, n * sz), "WRITEs placed");
	CHECK(!memcmp(a.buf + 300000, a.buf, n * sz), "READs placed");
	CHECK(*ctr == (uint64_t)na, "each FETCH_ADD once: %llu", (unsigned long long)*ctr);
	for (int i = 0; i < na; i++)
		CHECK(((uint64_t *)(a.buf + 600000))[i] == (uint64_t)i, "FETCH_ADD %d saw %d", i, i);

	/* READs longer than the window (196 packets): a requester resuming one after a lost
	 * response asks for ranges that run past what it asked before */
	set_ctl("drop_pct=10\n");
	sleep_ms(300);
	for (int i = 0; i < 3; i++) {
		memset(a.buf + 700000, 0, 200000);
		struct ibv_sge s = {(uintptr_t)a.buf + 700000, 200000, a.mr->lkey};
		CHECK(post_rdma(a.qp, IBV_WR_RDMA_READ, 100 + i, &s, 1, rva, rmr->rkey, 0) == 0, "long read");
		CHECK(wait_wcs(a.scq, ws, 1, 60) == 1 && ws[0].status == IBV_WC_SUCCESS && ws[0].wr_id == (uint64_t)(100 + i),
		      "long READ %d completes: %s", i, ibv_wc_status_str(ws[0].status));
		CHECK(!memcmp(a.buf + 700000, rbuf, 200000), "long READ %d placed", i);
	}
	set_ctl("");
	sleep_ms(300);
	ibv_dereg_mr(rmr);
	free(rbuf);
	free_side(&a);
	free_side(&b);
}

/* Across processes: the responder's memory is in a child; WRITE, READ back, FETCH_ADD, and
 * the child checks its memory. */
static void test_rdma_process(void)
{
	cur_test = "rdma across processes";
	int up[2], down[2];
	REQUIRE(!pipe(up) && !pipe(down), "pipes");
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		struct side b;
		uint32_t peer = 0;
		if (new_side(&b, defaults()))
			_exit(3);
		uint8_t *rbuf = calloc(1, 65536);
		struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, 65536, REMOTE_ALL);
		if (!rbuf || !rmr)
			_exit(4);
		uint64_t info[3] = {b.qp->qp_num, rmr->rkey, (uintptr_t)rbuf};
		if (write(up[1], info, sizeof(info)) != sizeof(info) || read(down[0], &peer, 4) != 4)
			_exit(5);
		if (connect_qp(b.qp, b.ctx, peer, defaults()) || set_access(b.qp, REMOTE_ALL))
			_exit(6);
		if (write(up[1], &peer, 4) != 4 || read(down[0], &peer, 4) != 4)
			_exit(7);
		for (int i = 0; i < 50000; i++)
			if (rbuf[i] != (uint8_t)(i * 3 + 1))
				_exit(8);
		if (*(uint64_t *)(rbuf + 65528) != 42)
			_exit(9);
		_exit(0);
	}
	struct side a;
	uint64_t info[3];
	uint32_t peer;
	REQUIRE(!new_side(&a, defaults()), "side");
	REQUIRE(read(up[0], info, sizeof(info)) == sizeof(info), "child info");
	uint32_t mine = a.qp->qp_num;
	REQUIRE(write(down[1], &mine, 4) == 4, "send qpn");
	REQUIRE(read(up[0], &peer, 4) == 4, "child ready");
	REQUIRE(connect_qp(a.qp, a.ctx, (uint32_t)info[0], defaults()) == 0, "connect");
	for (int i = 0; i < 50000; i++)
		a.buf[i] = (uint8_t)(i * 3 + 1);
	struct ibv_sge s = {(uintptr_t)a.buf, 50000, a.mr->lkey};
	struct ibv_sge r = {(uintptr_t)a.buf + 100000, 50000, a.mr->lkey};
	struct ibv_sge s8 = {(uintptr_t)a.buf + 200000, 8, a.mr->lkey};
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE, 1, &s, 1, info[2], (uint32_t)info[1], 0) == 0, "write");
	CHECK(post_rdma(a.qp, IBV_WR_RDMA_READ, 2, &r, 1, info[2], (uint32_t)info[1], 0) == 0, "read");
	CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 3, &s8, info[2] + 65528, (uint32_t)info[1], 42, 0) == 0,
	      "fetch_add");
	struct ibv_wc ws[3];
	CHECK(wait_wcs(a.scq, ws, 3, 30) == 3, "3 WCs");
	for (int i = 0; i < 3; i++)
		CHECK(ws[i].status == IBV_WC_SUCCESS && ws[i].wr_id == (uint64_t)(i + 1), "wc %d: %s", i,
		      ibv_wc_status_str(ws[i].status));
	CHECK(!memcmp(a.buf + 100000, a.buf, 50000), "READ back what was written");
	CHECK(*(uint64_t *)(a.buf + 200000) == 0, "FETCH_ADD original 0");
	CHECK(write(down[1], &mine, 4) == 4, "tell the child");
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child saw its memory (status %d)", st);
	free_side(&a);
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
}

/* Same host: a SEND between two processes of this host moves its payload by process_vm_readv
 * (samehost_* counters), whole and in order, also with 10% of the packets lost. With refuse, the receiver may not read the
 * sender (the sender is not dumpable and the receiver lacks CAP_SYS_PTRACE, as between two
 * users' processes): it answers NAK NOREF, and the sender falls back to datagrams carrying
 * the bytes — every SEND still completes, whole. */
static void samehost_case(int refuse, int loss)
{
	enum { N = 4, LEN = 65536 };
	int up[2], down[2];
	REQUIRE(!pipe(up) && !pipe(down), "pipes");
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		if (refuse) {
			struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
			struct __user_cap_data_struct d[2];
			if (syscall(SYS_capget, &h, d))
				_exit(2);
			d[0].effective &= ~(1u << CAP_SYS_PTRACE);
			if (syscall(SYS_capset, &h, d))
				_exit(2);
		}
		struct side b;
		uint32_t peer = 0;
		/* the counters as the fork left them */
		uint64_t rx0 = counter(0, "samehost_rx_packets"), refused0 = counter(0, "samehost_refused");
		if (new_side(&b, defaults()))
			_exit(3);
		for (int i = 0; i < N; i++)
			if (post_recv(&b, b.qp, (uint64_t)i, i * LEN, LEN))
				_exit(4);
		if (write(up[1], &b.qp->qp_num, 4) != 4 || read(down[0], &peer, 4) != 4)
			_exit(5);
		if (connect_qp(b.qp, b.ctx, peer, defaults()))
			_exit(6);
		if (write(up[1], &peer, 4) != 4)
			_exit(7);
		struct ibv_wc wc[N];
		if (wait_wcs(b.rcq, wc, N, 30) != N)
			_exit(8);
		for (int i = 0; i < N; i++) {
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != (uint64_t)i || wc[i].byte_len != LEN)
				_exit(9);
			for (int j = 0; j < LEN; j++)
				if (b.buf[RECV_BASE + i * LEN + j] != (uint8_t)(j * 7 + i * 13 + 1))
					_exit(10);
		}
		uint64_t rx = counter(0, "samehost_rx_packets") - rx0, refused = counter(0, "samehost_refused") - refused0;
		if (refuse ? rx != 0 || refused == 0 : rx < N * LEN / 1024 || refused != 0 ||
		    (loss && counter(0, "tx_dropped") == 0))
			_exit(11);
		/* the last ACK may be lost: answer the sender's retries until it has its WCs */
		if (read(down[0], &peer, 4) != 4)
			_exit(12);
		_exit(0);
	}
	struct side a;
	uint32_t peer, ready;
	uint64_t tx0 = counter(0, "samehost_tx_packets");
	if (refuse)
		CHECK(prctl(PR_SET_DUMPABLE, 0) == 0, "not dumpable");
	if (!new_side(&a, defaults()) && read(up[0], &peer, 4) == 4) {
		uint32_t mine = a.qp->qp_num;
		CHECK(write(down[1], &mine, 4) == 4, "send qpn");
		CHECK(read(up[0], &ready, 4) == 4, "child ready");
		CHECK(connect_qp(a.qp, a.ctx, peer, defaults()) == 0, "connect");
		for (int i = 0; i < N; i++)
			for (int j = 0; j < LEN; j++)
				a.buf[i * LEN + j] = (uint8_t)(j * 7 + i * 13 + 1);
		for (int i = 0; i < N; i++)
			CHECK(post_send(&a, a.qp, (uint64_t)i, i * LEN, LEN, IBV_SEND_SIGNALED) == 0, "post %d", i);
		struct ibv_wc ws[N];
		CHECK(wait_wcs(a.scq, ws, N, 30) == N, "%d WCs", N);
		for (int i = 0; i < N; i++)
			CHECK(ws[i].status == IBV_WC_SUCCESS && ws[i].wr_id == (uint64_t)i, "wc %d: %s", i,
			      ibv_wc_status_str(ws[i].status));
		CHECK(counter(0, "samehost_tx_packets") > tx0, "payloads sent as references");
	} else {
		CHECK(0, "side");
	}
	CHECK(write(down[1], &peer, 4) == 4, "tell the receiver");
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the receiver got every SEND whole (status %d)", st);
	if (refuse)
		prctl(PR_SET_DUMPABLE, 1);
	free_side(&a);
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
}

/* A reference is taken only from the QP's peer: one forged by another socket of the host
 * (pointing at readable memory with a matching token) places nothing, and the peer's own
 * SEND at that PSN still lands. */
static void test_ref_stranger(void)
{
	cur_test = "reference from a stranger";
	struct side a, b;
	struct ibv_wc wc[1];
	REQUIRE(!pair(&a, &b, defaults(), defaults()), "pair");
	CHECK(post_recv(&b, b.qp, 1, 0, 4096) == 0, "recv");
	static uint64_t blk[2 + 512];
	blk[0] = 0x1234567887654321ULL;
	memset(&blk[2], 0xab, 4096);
	struct sv_hdr h = {.op = SV_OP_SEND_ONLY, .flags = SV_FLAG_REF, .dqpn = b.qp->qp_num, .sqpn = a.qp->qp_num,
			   .psn = 0, .len = 2048, .rpid = (uint32_t)getpid(), .rva = (uintptr_t)&blk[2],
			   .tokva = (uintptr_t)blk, .tok = blk[0]};
	uint8_t pkt[SV_MAX_HDR];
	size_t n = sv_encode(&h, pkt);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)b.qp->qp_num),
				 .sin_addr = {htonl(0x7f000001)}};
	CHECK(fd >= 0 && sendto(fd, pkt, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n, "forge");
	CHECK(cq_empty_for(b.rcq, 300), "a reference from another socket placed nothing");
	memset(a.buf, 0x5c, 2048);
	CHECK(post_send(&a, a.qp, 1, 0, 2048, IBV_SEND_SIGNALED) == 0, "send");
	CHECK(wait_wcs(b.rcq, wc, 1, 20) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == 2048,
	      "the peer's SEND lands");
	CHECK(b.buf[RECV_BASE] == 0x5c && b.buf[RECV_BASE + 2047] == 0x5c, "the peer's bytes");
	if (fd >= 0)
		close(fd);
	free_side(&a);
	free_side(&b);
}

static void test_samehost(void)
{
	cur_test = "same host";
	samehost_case(0, 0);
	cur_test = "same host, refused";
	samehost_case(1, 0);
	cur_test = "same host, 10% loss";
	set_ctl("drop_pct=10\n");
	sleep_ms(300); /* the progress threads re-read the file every 100 ms */
	samehost_case(0, 1);
	set_ctl("");
	sleep_ms(300);
	test_ref_stranger();
}

/* UC: the IB spec's UC attribute masks, SEND and WRITE (with immediate) delivered, no RDMA READ
 * or atomics; a message without a RECV is dropped with no error on either side; under loss,
 * every SEND completes at the requester and what arrives is whole and in order. */
static int connect_uc(struct ibv_qp *qp, struct ibv_context *ctx, uint32_t dqpn, struct qopts o)
{
	struct ibv_qp_attr a;
	rtr_attr(&a, dqpn, 3, o);
	if (ibv_query_gid(ctx, 1, 3, &a.ah_attr.grh.dgid))
		return -1;
	const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (ibv_modify_qp(qp, &a, rtr | IBV_QP_MIN_RNR_TIMER) != EINVAL) /* an RC-only attribute */
		return -2;
	int rc = ibv_modify_qp(qp, &a, rtr);
	if (rc)
		return rc;
	rts_attr(&a, o);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT) != EINVAL)
		return -3;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

static void test_uc(void)
{
	cur_test = "uc";
	struct qopts o = defaults();
	o.send_wr = 128;
	o.recv_wr = 128;
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_qp *aq, *bq;
	struct ibv_qp_init_attr qa = {.send_cq = a.scq, .recv_cq = a.rcq, .qp_type = IBV_QPT_UC,
				      .cap = {.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 2,
					      .max_recv_sge = 2}};
	aq = ibv_create_qp(a.pd, &qa);
	qa.send_cq = b.scq;
	qa.recv_cq = b.rcq;
	bq = ibv_create_qp(b.pd, &qa);
	REQUIRE(aq && bq && aq->qp_type == IBV_QPT_UC, "UC QPs");
	REQUIRE(!to_init(aq) && !to_init(bq), "INIT");
	struct ibv_qp_attr at = {.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
	REQUIRE(!ibv_modify_qp(bq, &at, IBV_QP_ACCESS_FLAGS), "REMOTE_WRITE");
	int rc1 = connect_uc(aq, a.ctx, bq->qp_num, o), rc2 = connect_uc(bq, b.ctx, aq->qp_num, o);
	REQUIRE(rc1 == 0 && rc2 == 0, "UC masks and connect (%d, %d)", rc1, rc2);
	uint8_t *rbuf = calloc(1, 65536);
	struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(rbuf && rmr, "MR");
	struct ibv_wc wc[64];

	/* a SEND without a RECV is dropped; the next one, with a RECV, arrives */
	uint64_t rx0 = counter(0, "rx_packets");
	CHECK(post_send(&a, aq, 1, 0, 100, IBV_SEND_SIGNALED) == 0, "send without RECV");
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1 && wc[0].status == IBV_WC_SUCCESS, "completes at the requester");
	/* the responder has handled it once its device counted it (both under its context's lock) */
	double until = now_s() + 30;
	while (counter(0, "rx_packets") == rx0 && now_s() < until)
		sleep_ms(1);
	for (int i = 0; i < 5000; i++)
		a.buf[i] = (uint8_t)(i * 5);
	CHECK(post_recv(&b, bq, 10, 0, 8192) == 0, "recv");
	CHECK(post_send(&a, aq, 2, 0, 5000, IBV_SEND_SIGNALED) == 0, "send");
	CHECK(wait_wcs(b.rcq, wc, 1, 30) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 10 &&
		      wc[0].byte_len == 5000 && !memcmp(b.buf + RECV_BASE, a.buf, 5000),
	      "delivered whole: %s id %llu len %u", ibv_wc_status_str(wc[0].status), (unsigned long long)wc[0].wr_id, wc[0].byte_len);
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1 && wc[0].wr_id == 2, "send done");

	/* WRITE and WRITE with immediate; READ and atomics refused */
	struct ibv_sge sg = {(uintptr_t)a.buf, 5000, a.mr->lkey};
	CHECK(post_rdma(aq, IBV_WR_RDMA_WRITE, 3, &sg, 1, (uintptr_t)rbuf, rmr->rkey, 0) == 0, "write");
	CHECK(post_recv(&b, bq, 11, 0, 0) == 0, "recv");
	CHECK(post_rdma(aq, IBV_WR_RDMA_WRITE_WITH_IMM, 4, &sg, 1, (uintptr_t)rbuf + 10000, rmr->rkey, 7) == 0,
	      "write imm");
	CHECK(wait_wcs(b.rcq, wc, 1, 30) == 1 && wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc[0].imm_data == 7 &&
		      wc[0].byte_len == 5000,
	      "WRITE_WITH_IMM arrives");
	CHECK(!memcmp(rbuf, a.buf, 5000) && !memcmp(rbuf + 10000, a.buf, 5000), "both WRITEs placed");
	CHECK(wait_wcs(a.scq, wc, 2, 30) == 2 && wc[0].opcode == IBV_WC_RDMA_WRITE, "writes done");
	CHECK(post_rdma(aq, IBV_WR_RDMA_READ, 5, &sg, 1, (uintptr_t)rbuf, rmr->rkey, 0) == EINVAL, "no READ on UC");

	/* loss: every SEND completes; what arrives is whole and in order */
	set_ctl("drop_pct=20\n");
	sleep_ms(300);
	const int n = 40, sz = 3000;
	for (int i = 0; i < n + 1; i++)
		CHECK(post_recv(&b, bq, 100 + i, (i % 20) * 3000, sz) == 0, "recv");
	for (int i = 0; i < n * sz; i++)
		a.buf[i] = (uint8_t)(i / sz);
	for (int i = 0; i < n; i++)
		CHECK(post_send(&a, aq, 100 + i, i * sz, sz, IBV_SEND_SIGNALED) == 0, "send");
	CHECK(wait_wcs(a.scq, wc, n, 30) == n, "all %d complete at the requester", n);
	set_ctl("");
	sleep_ms(300);
	/* a last SEND, sent after the others and unlossy: once it is in, all that will come is */
	memset(a.buf + n * sz, 0xee, 16);
	CHECK(post_send(&a, aq, 999, n * sz, 16, IBV_SEND_SIGNALED) == 0, "marker");
	int got = 0, seen_marker = 0;
	uint64_t prev = 0;
	double end = now_s() + 30;
	while (!seen_marker && now_s() < end) {
		int k = ibv_poll_cq(b.rcq, 1, wc);
		if (k <= 0) {
			sleep_ms(1);
			continue;
		}
		CHECK(wc[0].status == IBV_WC_SUCCESS, "no error: %s", ibv_wc_status_str(wc[0].status));
		if (wc[0].byte_len == 16) {
			seen_marker = 1;
			break;
		}
		CHECK(wc[0].byte_len == (uint32_t)sz && wc[0].wr_id > prev, "whole, in order");
		prev = wc[0].wr_id;
		got++;
	}
	CHECK(seen_marker && got <= n, "marker after %d of %d", got, n);
	ibv_dereg_mr(rmr);
	free(rbuf);
	CHECK(!ibv_destroy_qp(aq) && !ibv_destroy_qp(bq), "destroy");
	free_side(&a);
	free_side(&b);
}

/* UD: the UD attribute masks, address handles, the GRH before the payload, Q_Key checks (a
 * wrong one dropped, the high bit meaning the QP's own), one-MTU messages, and a reply to the
 * sender through ibv_create_ah_from_wc. */
static struct ibv_qp *ud_qp(struct side *s, uint32_t qkey)
{
	struct ibv_qp_init_attr qa = {.send_cq = s->scq, .recv_cq = s->rcq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &qa);
	if (!qp)
		return NULL;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) != EINVAL) /* QKEY needed */
		return NULL;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

static int post_ud(struct side *s, struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey, uint64_t id,
		   int off, int len, enum ibv_wr_opcode op)
{
	struct ibv_sge sg = {(uintptr_t)s->buf + off, (uint32_t)len, s->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = 77}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(qp, &wr, &bad);
}

static void test_ud(void)
{
	cur_test = "ud";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	const uint32_t qk = 0x11111111;
	struct ibv_qp *aq = ud_qp(&a, qk), *bq = ud_qp(&b, qk);
	REQUIRE(aq && bq, "UD QPs and masks");
	struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1, .grh = {.sgid_index = 3, .hop_limit = 1}};
	REQUIRE(!ibv_query_gid(a.ctx, 1, 3, &ah_attr.grh.dgid), "gid");
	struct ibv_ah *ah = ibv_create_ah(a.pd, &ah_attr);
	REQUIRE(ah, "create_ah: %s", strerror(errno));
	struct ibv_ah_attr bad_attr = ah_attr;
	bad_attr.is_global = 0;
	errno = 0;
	CHECK(ibv_create_ah(a.pd, &bad_attr) == NULL && errno == EINVAL, "a RoCE AH needs a GRH");
	struct ibv_wc wc[2];

	/* a wrong Q_Key is dropped */
	CHECK(post_recv(&b, bq, 1, 0, 2048) == 0, "recv");
	uint64_t rx0 = counter(0, "rx_packets");
	CHECK(post_ud(&a, aq, ah, bq->qp_num, qk + 1, 10, 0, 100, IBV_WR_SEND) == 0, "send, wrong qkey");
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1 && wc[0].status == IBV_WC_SUCCESS, "it completes at the sender");
	double until = now_s() + 30;
	while (counter(0, "rx_packets") == rx0 && now_s() < until)
		sleep_ms(1);
	CHECK(cq_empty_for(b.rcq, 10), "dropped");

	/* the high bit: the sender QP's own Q_Key; the RECV holds the GRH, then the payload */
	for (int i = 0; i < 1000; i++)
		a.buf[i] = (uint8_t)(i + 9);
	CHECK(post_ud(&a, aq, ah, bq->qp_num, 0x80000000u, 11, 0, 1000, IBV_WR_SEND_WITH_IMM) == 0, "send");
	CHECK(wait_wcs(b.rcq, wc, 1, 30) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 1 &&
		      wc[0].byte_len == 1040 && (wc[0].wc_flags & IBV_WC_GRH) && (wc[0].wc_flags & IBV_WC_WITH_IMM) &&
		      wc[0].imm_data == 77 && wc[0].src_qp == aq->qp_num,
	      "received: %s len %u flags %#x", ibv_wc_status_str(wc[0].status), wc[0].byte_len, wc[0].wc_flags);
	struct ibv_grh *grh = (struct ibv_grh *)(b.buf + RECV_BASE);
	CHECK(!memcmp(b.buf + RECV_BASE + 40, a.buf, 1000), "payload after the GRH");
	CHECK(!memcmp(grh->sgid.raw, ah_attr.grh.dgid.raw, 16) && grh->next_hdr == 0x1b, "GRH");
	CHECK(wait_wcs(a.scq, wc, 1, 30) == 1 && wc[0].wr_id == 11, "send done");

	/* a reply through the AH made from the WC */
	struct ibv_wc rwc = {.wc_flags = IBV_WC_GRH, .src_qp = aq->qp_num};
	struct ibv_ah *back = ibv_create_ah_from_wc(b.pd, &rwc, grh, 1);
	CHECK(back != NULL, "create_ah_from_wc: %s", strerror(errno));
	CHECK(post_recv(&a, aq, 2, 0, 2048) == 0, "recv");
	CHECK(back && post_ud(&b, bq, back, rwc.src_qp, qk, 12, 0, 16, IBV_WR_SEND) == 0, "reply");
	CHECK(wait_wcs(a.rcq, wc, 1, 30) == 1 && wc[0].wr_id == 2 && wc[0].src_qp == bq->qp_num, "reply received");
	CHECK(wait_wcs(b.scq, wc, 1, 30) == 1, "reply done");

	/* refused at post: above the MTU (1024), RDMA on UD, no AH */
	CHECK(post_ud(&a, aq, ah, bq->qp_num, qk, 13, 0, 1025, IBV_WR_SEND) == EINVAL, "above the MTU");
	CHECK(post_ud(&a, aq, ah, bq->qp_num, qk, 13, 0, 16, IBV_WR_RDMA_WRITE) == EINVAL, "WRITE on UD");
	CHECK(post_ud(&a, aq, NULL, bq->qp_num, qk, 13, 0, 16, IBV_WR_SEND) == EINVAL, "no AH");
	if (back)
		CHECK(ibv_destroy_ah(back) == 0, "destroy ah");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy ah");
	CHECK(!ibv_destroy_qp(aq) && !ibv_destroy_qp(bq), "destroy");
	free_side(&a);
	free_side(&b);
}

/* ibv_create_qp_ex and the ibv_wr_* API: a chain of a SEND with inline data, a WRITE with
 * immediate and a FETCH_ADD built and posted by ibv_wr_complete; a builder softverbs does not
 * offer fails the chain with EINVAL; unsupported send ops are EOPNOTSUPP at create. */
static void test_qp_ex(void)
{
	cur_test = "qp_ex";
	struct qopts o = defaults();
	struct side a, b;
	REQUIRE(!new_side(&a, o) && !new_side(&b, o), "sides");
	struct ibv_qp_init_attr_ex xa = {.send_cq = a.scq, .recv_cq = a.rcq, .qp_type = IBV_QPT_RC,
					 .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
						 .max_recv_sge = 2, .max_inline_data = 64},
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .pd = a.pd,
					 .send_ops_flags = IBV_QP_EX_WITH_BIND_MW};
	errno = 0;
	CHECK(!ibv_create_qp_ex(a.ctx, &xa) && errno == EOPNOTSUPP, "BIND_MW send op refused");
	xa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	struct ibv_qp *qp = ibv_create_qp_ex(a.ctx, &xa);
	REQUIRE(qp, "create_qp_ex: %s", strerror(errno));
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	REQUIRE(x && ibv_qp_to_qp_ex(a.qp) == NULL, "qp_to_qp_ex");
	REQUIRE(!to_init(qp) && !connect_qp(qp, a.ctx, b.qp->qp_num, o) && !connect_qp(b.qp, b.ctx, qp->qp_num, o),
		"connect");
	REQUIRE(!set_access(b.qp, REMOTE_ALL), "access");
	uint8_t *rbuf = calloc(1, 4096);
	struct ibv_mr *rmr = ibv_reg_mr(b.pd, rbuf, 4096, REMOTE_ALL);
	REQUIRE(rbuf && rmr, "MR");
	CHECK(post_recv(&b, b.qp, 1, 0, 256) == 0 && post_recv(&b, b.qp, 2, 256, 256) == 0, "recvs");
	memset(a.buf, 0x3c, 100);
	char msg[] = "inline hello";
	ibv_wr_start(x);
	x->wr_id = 10;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, msg, sizeof(msg));
	x->wr_id = 11;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(x, rmr->rkey, (uintptr_t)rbuf + 100, htonl(5));
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf, 100);
	x->wr_id = 12;
	ibv_wr_atomic_fetch_add(x, rmr->rkey, (uintptr_t)rbuf + 1024, 9);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf + 2048, 8);
	CHECK(ibv_wr_complete(x) == 0, "wr_complete");
	struct ibv_wc wc[3];
	CHECK(wait_wcs(a.scq, wc, 3, 30) == 3, "3 WCs");
	for (int i = 0; i < 3; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(10 + i), "wc %d: %s", i,
		      ibv_wc_status_str(wc[i].status));
	CHECK(wc[0].opcode == IBV_WC_SEND && wc[1].opcode == IBV_WC_RDMA_WRITE && wc[2].opcode == IBV_WC_FETCH_ADD,
	      "opcodes");
	CHECK(wait_wcs(b.rcq, wc, 2, 30) == 2 && wc[0].byte_len == sizeof(msg) &&
		      !memcmp(b.buf + RECV_BASE, msg, sizeof(msg)) && wc[1].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      wc[1].imm_data == htonl(5),
	      "SEND and WRITE_WITH_IMM received");
	CHECK(rbuf[100] == 0x3c && rbuf[199] == 0x3c && *(uint64_t *)(rbuf + 1024) == 9, "WRITE and FETCH_ADD placed");
	ibv_wr_start(x);
	ibv_wr_send(x);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_local_inv(x, 1);
	CHECK(ibv_wr_complete(x) == EINVAL, "a builder softverbs does not offer fails the chain");
	CHECK(cq_empty_for(a.scq, 10), "nothing of it posted");
	ibv_dereg_mr(rmr);
	free(rbuf);
	CHECK(!ibv_destroy_qp(qp), "destroy");
	free_side(&a);
	free_side(&b);
}

/* run_devices runs the tests of several devices in a child of this program: the device list
 * is read once per process, from the environment. */
static void run_devices(const char *self)
{
	cur_test = "devices";
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		setenv("SOFTVERBS_DEVICES", "2", 1);
		setenv("SOFTVERBS_PHANTOM", "1", 1);
		unsetenv("SOFTVERBS_DEVICE"); /* the names and addresses the checks expect */
		unsetenv("SOFTVERBS_IPV4");
		execl("/proc/self/exe", self, "devices", (char *)NULL);
		_exit(127);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the devices child failed (status %d)", st);
}

/* By default one device, SOFTVERBS_DEVICE (softverbs0). */
static void test_one_device(void)
{
	cur_test = "one device";
	if (getenv("SOFTVERBS_DEVICES") || getenv("SOFTVERBS_PHANTOM"))
		return;
	const char *want = getenv("SOFTVERBS_DEVICE") && *getenv("SOFTVERBS_DEVICE") ? getenv("SOFTVERBS_DEVICE")
										 : "softverbs0";
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	REQUIRE(l, "list");
	CHECK(n == 1 && !strcmp(ibv_get_device_name(l[0]), want), "one device, %s (%d)", want, n);
	ibv_free_device_list(l);
}

int main(int argc, char **argv)
{
	int devices = argc > 1 && !strcmp(argv[1], "devices");
	snprintf(ctl_path, sizeof(ctl_path), "/tmp/softverbs-test-%d.ctl", (int)getpid());
	unsetenv("SOFTVERBS_SAMEHOST"); /* the default, which test_samehost checks */
	setenv("SOFTVERBS_CTL", ctl_path, 1);
	set_ctl("");
	static const struct sv_case base[] = {
		{"one device", test_one_device},
		{"modify rules", test_modify_rules}, {"bad arguments", test_bad_args},
		{"delivery", test_delivery}, {"post and QP state", test_post_before_rts}, {"rnr", test_rnr}, {"flush", test_flush},
		{"overrun", test_overrun}, {"channel", test_channel}, {"busy poller hands back", test_poller_handback},
		{"dead peer", test_dead_peer},
		{"loss", test_loss}, {"faults", test_faults},
		{"rdma", test_rdma}, {"rdma errors", test_rdma_errors}, {"rdma loss", test_rdma_loss},
		{"rdma across processes", test_rdma_process}, {"same host", test_samehost}, {"srq", test_srq},
		{"uc", test_uc}, {"ud", test_ud}, {"qp_ex", test_qp_ex},
	};
	static const struct sv_case several[] = {
		{"device list", test_device_list}, {"two devices", test_device_traffic},
		{"per-device faults", test_device_faults},
	};
	if (devices) {
		run_tests(several, sizeof(several) / sizeof(several[0]));
	} else {
		run_tests(base, sizeof(base) / sizeof(base[0]));
		int before = failures;
		double t0 = now_s();
		run_devices(argv[0]);
		printf("%s devices: SOFTVERBS_DEVICES=2 SOFTVERBS_PHANTOM=1 (%.2fs)\n", failures == before ? "ok  " : "FAIL",
		       now_s() - t0);
	}
	unlink(ctl_path);
	if (failures) {
		printf("sv_test%s: %d failures\n", devices ? " devices" : "", failures);
		return 1;
	}
	printf("sv_test%s: all passed\n", devices ? " devices" : "");
	return 0;
}
