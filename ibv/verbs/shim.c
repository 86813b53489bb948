//go:build rdma

#define _GNU_SOURCE // dladdr, dlvsym
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <endian.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

// tsv_verbs is the table of libibverbs entry points, filled once by tsv_load. Declared
// before shim.h poisons the names: __typeof__ only takes each function's type from
// verbs.h and makes no reference to the symbol.
struct tsv_verbs {
	__typeof__(ibv_get_device_list) *get_device_list;
	__typeof__(ibv_free_device_list) *free_device_list;
	__typeof__(ibv_get_device_name) *get_device_name;
	__typeof__(ibv_get_device_guid) *get_device_guid;
	__typeof__(ibv_open_device) *open_device;
	__typeof__(ibv_close_device) *close_device;
	__typeof__(ibv_fork_init) *fork_init;
	__typeof__(ibv_query_device) *query_device;
	__typeof__(ibv_query_port) *query_port; // the compat entry point, see tsv_query_port
	__typeof__(ibv_query_gid) *query_gid;
	__typeof__(ibv_alloc_pd) *alloc_pd;
	__typeof__(ibv_dealloc_pd) *dealloc_pd;
	__typeof__(ibv_reg_mr) *reg_mr;
	__typeof__(ibv_dereg_mr) *dereg_mr;
	__typeof__(ibv_create_comp_channel) *create_comp_channel;
	__typeof__(ibv_destroy_comp_channel) *destroy_comp_channel;
	__typeof__(ibv_create_cq) *create_cq;
	__typeof__(ibv_destroy_cq) *destroy_cq;
	__typeof__(ibv_get_cq_event) *get_cq_event;
	__typeof__(ibv_ack_cq_events) *ack_cq_events;
	__typeof__(ibv_create_qp) *create_qp;
	__typeof__(ibv_query_qp) *query_qp;
	__typeof__(ibv_modify_qp) *modify_qp;
	__typeof__(ibv_destroy_qp) *destroy_qp;
	__typeof__(ibv_get_async_event) *get_async_event;
	__typeof__(ibv_ack_async_event) *ack_async_event;
	__typeof__(_ibv_query_gid_table) *query_gid_table; // optional: NULL before rdma-core v31
};

#include "shim.h"

static struct tsv_verbs fn;

// tsv_sym is one entry point: its exported name, the version rdma-core exports it under
// (libibverbs/libibverbs.map.in; the IBVERBS_1.0 twins of the 1.1 ones are the pre-2006 ABI,
// with other struct layouts, so a plain dlsym's default is not trusted), where it goes in
// the table, and whether the provider works without it.
struct tsv_sym {
	const char *name;
	const char *version;
	size_t off;
	int optional;
};

#define TSV_SYM(field, name, version, optional) \
	{ name, version, offsetof(struct tsv_verbs, field), optional }

static const struct tsv_sym syms[] = {
	TSV_SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", 0),
	TSV_SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", 0),
	TSV_SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1", 0),
	TSV_SYM(get_device_guid, "ibv_get_device_guid", "IBVERBS_1.1", 0),
	TSV_SYM(open_device, "ibv_open_device", "IBVERBS_1.1", 0),
	TSV_SYM(close_device, "ibv_close_device", "IBVERBS_1.1", 0),
	TSV_SYM(fork_init, "ibv_fork_init", "IBVERBS_1.1", 0),
	TSV_SYM(query_device, "ibv_query_device", "IBVERBS_1.1", 0),
	TSV_SYM(query_port, "ibv_query_port", "IBVERBS_1.1", 0),
	TSV_SYM(query_gid, "ibv_query_gid", "IBVERBS_1.1", 0),
	TSV_SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", 0),
	TSV_SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", 0),
	TSV_SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", 0),
	TSV_SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", 0),
	TSV_SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0", 0),
	TSV_SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", 0),
	TSV_SYM(create_cq, "ibv_create_cq", "IBVERBS_1.1", 0),
	TSV_SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", 0),
	TSV_SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1", 0),
	TSV_SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1", 0),
	TSV_SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1", 0),
	TSV_SYM(query_qp, "ibv_query_qp", "IBVERBS_1.1", 0),
	TSV_SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1", 0),
	TSV_SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", 0),
	TSV_SYM(get_async_event, "ibv_get_async_event", "IBVERBS_1.1", 0),
	TSV_SYM(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1", 0),
	TSV_SYM(query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11", 1),
};

#define TSV_NSYMS ((int)(sizeof(syms) / sizeof(syms[0])))

const char *tsv_sym_name(int i)
{
	return i >= 0 && i < TSV_NSYMS ? syms[i].name : "";
}

const char *tsv_sym_version(int i)
{
	return i >= 0 && i < TSV_NSYMS ? syms[i].version : "";
}

int tsv_nsyms(void)
{
	return TSV_NSYMS;
}

int tsv_sym_optional(int i)
{
	return i >= 0 && i < TSV_NSYMS ? syms[i].optional : 0;
}

static void copy_str(char *dst, size_t n, const char *src)
{
	if (n == 0)
		return;
	snprintf(dst, n, "%s", src ? src : "");
}

static void *lookup(void *h, const struct tsv_sym *s)
{
#ifdef __GLIBC__
	return dlvsym(h, s->name, s->version);
#else
	return dlsym(h, s->name); // no symbol versions outside glibc (musl)
#endif
}

int tsv_load(const char *path, int install, char *err, size_t errlen, char *where, size_t wherelen)
{
	copy_str(err, errlen, "");
	copy_str(where, wherelen, "");
	dlerror(); // clear a stale error
	// RTLD_NOW: libibverbs' own undefined symbols are bound here, so a broken install fails
	// now with dlerror's text instead of killing the process at its first lazy call.
	// RTLD_LOCAL: its symbols stay out of the global scope, where they could interpose on
	// (or be interposed by) another copy in the process; rdma-core's drivers
	// (libmlx5-rdmav34.so ...) need libibverbs.so.1 and find this one through that.
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		copy_str(err, errlen, dlerror());
		return -1;
	}
	struct tsv_verbs t;
	memset(&t, 0, sizeof(t));
	for (int i = 0; i < TSV_NSYMS; i++) {
		dlerror();
		void *p = lookup(h, &syms[i]);
		if (!p && !syms[i].optional) {
			copy_str(err, errlen, dlerror());
			dlclose(h);
			return 1 + i;
		}
		memcpy((char *)&t + syms[i].off, &p, sizeof(p));
	}
	Dl_info info;
	if (dladdr((void *)t.get_device_list, &info) && info.dli_fname)
		copy_str(where, wherelen, info.dli_fname);
	else
		copy_str(where, wherelen, path);
	if (!install) {
		dlclose(h);
		return 0;
	}
	fn = t;
	return 0;
}

struct ibv_device **tsv_get_device_list(int *num)
{
	return fn.get_device_list(num);
}

void tsv_free_device_list(struct ibv_device **list)
{
	fn.free_device_list(list);
}

const char *tsv_get_device_name(struct ibv_device *dev)
{
	return fn.get_device_name(dev);
}

struct ibv_context *tsv_open_device(struct ibv_device *dev)
{
	return fn.open_device(dev);
}

int tsv_close_device(struct ibv_context *ctx)
{
	return fn.close_device(ctx);
}

int tsv_fork_init(void)
{
	return fn.fork_init();
}

int tsv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	return fn.query_device(ctx, attr);
}

int tsv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	return fn.query_gid(ctx, port, index, gid);
}

struct ibv_pd *tsv_alloc_pd(struct ibv_context *ctx)
{
	return fn.alloc_pd(ctx);
}

int tsv_dealloc_pd(struct ibv_pd *pd)
{
	return fn.dealloc_pd(pd);
}

int tsv_dereg_mr(struct ibv_mr *mr)
{
	return fn.dereg_mr(mr);
}

struct ibv_comp_channel *tsv_create_comp_channel(struct ibv_context *ctx)
{
	return fn.create_comp_channel(ctx);
}

int tsv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	return fn.destroy_comp_channel(ch);
}

int tsv_destroy_cq(struct ibv_cq *cq)
{
	return fn.destroy_cq(cq);
}

void tsv_ack_cq_events(uintptr_t cq, unsigned int n)
{
	fn.ack_cq_events((struct ibv_cq *)cq, n);
}

int tsv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	return fn.query_qp(qp, attr, mask, init);
}

int tsv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	return fn.modify_qp(qp, attr, mask);
}

int tsv_destroy_qp(struct ibv_qp *qp)
{
	return fn.destroy_qp(qp);
}

int tsv_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return errno;
	if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

struct ibv_mr *tsv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	// ibv_reg_mr@IBVERBS_1.1 itself: what verbs.h's macro would pick for access flags
	// without IBV_ACCESS_OPTIONAL_RANGE bits (twosided uses none).
	return fn.reg_mr(pd, addr, len, access);
}

// tsv_query_port is verbs.h's ibv_query_port: the context's extended query_port op when the
// driver has one (it fills the whole struct ibv_port_attr), else the exported compat entry
// point, which fills the older, shorter layout (the rest stays zero).
int tsv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	if (vctx)
		return vctx->query_port(ctx, port, out, sizeof(*out));
	memset(out, 0, sizeof(*out));
	return fn.query_port(ctx, port, (struct _compat_ibv_port_attr *)out);
}

// tsv_query_gid_table is -1 with errno EOPNOTSUPP when libibverbs predates
// _ibv_query_gid_table (rdma-core v31); the caller then reads GID 0 with ibv_query_gid.
ssize_t tsv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max)
{
	if (!fn.query_gid_table) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return fn.query_gid_table(ctx, entries, max, 0, sizeof(*entries));
}

struct ibv_cq *tsv_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle,
			     struct ibv_comp_channel *ch, int comp_vector)
{
	return fn.create_cq(ctx, cqe, (void *)handle, ch, comp_vector);
}

int tsv_num_comp_vectors(struct ibv_context *ctx)
{
	return ctx->num_comp_vectors;
}

// tsv_get_cq_event returns 0, or errno (EAGAIN on an empty non-blocking channel).
int tsv_get_cq_event(uintptr_t ch, uintptr_t ev)
{
	struct tsv_cq_event *e = (struct tsv_cq_event *)ev;
	void *ctx = NULL;
	if (fn.get_cq_event((struct ibv_comp_channel *)ch, &e->cq, &ctx))
		return errno ? errno : EIO;
	e->handle = (uintptr_t)ctx;
	return 0;
}

int tsv_req_notify(uintptr_t cq, int solicited_only)
{
	return ibv_req_notify_cq((struct ibv_cq *)cq, solicited_only);
}

int tsv_poll(uintptr_t cq, int n, struct ibv_wc *raw, struct tsv_wc *out)
{
	int got = ibv_poll_cq((struct ibv_cq *)cq, n, raw);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = raw[i].wr_id;
		out[i].status = raw[i].status;
		out[i].opcode = raw[i].opcode;
		out[i].vendor_err = raw[i].vendor_err;
		out[i].byte_len = raw[i].byte_len;
		out[i].imm_data = ntohl(raw[i].imm_data);
		out[i].qp_num = raw[i].qp_num;
		out[i].src_qp = raw[i].src_qp;
		out[i].wc_flags = raw[i].wc_flags;
	}
	return got;
}

struct ibv_qp *tsv_create_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
			     struct ibv_qp_cap *cap, int qp_type, int sq_sig_all, uintptr_t handle)
{
	struct ibv_qp_init_attr attr = {
		.qp_context = (void *)handle,
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.cap = *cap,
		.qp_type = qp_type,
		.sq_sig_all = sq_sig_all,
	};
	struct ibv_qp *qp = fn.create_qp(pd, &attr);
	if (qp)
		*cap = attr.cap;
	return qp;
}

// tsv_post_send chains n flat WRs in scratch and posts them. On failure *bad is the index
// of the first WR not posted and the return value is the errno.
int tsv_post_send(uintptr_t qpp, const struct tsv_send *in, int n,
		  struct ibv_sge *sges, uintptr_t scratchp, int *bad)
{
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_send_wr *scratch = (struct ibv_send_wr *)scratchp;
	struct ibv_sge *sg = sges;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &scratch[i];
		*w = (struct ibv_send_wr){
			.wr_id = in[i].wr_id,
			.next = i + 1 < n ? &scratch[i + 1] : NULL,
			.sg_list = in[i].num_sge ? sg : NULL,
			.num_sge = in[i].num_sge,
			.opcode = in[i].opcode,
			.send_flags = in[i].send_flags,
			.imm_data = htonl(in[i].imm_data),
		};
		sg += in[i].num_sge;
	}
	struct ibv_send_wr *b = NULL;
	int rc = ibv_post_send(qp, scratch, &b);
	*bad = rc && b ? (int)(b - scratch) : (rc ? 0 : n);
	return rc;
}

int tsv_post_recv(uintptr_t qpp, const struct tsv_recv *in, int n,
		  struct ibv_sge *sges, uintptr_t scratchp, int *bad)
{
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_recv_wr *scratch = (struct ibv_recv_wr *)scratchp;
	struct ibv_sge *sg = sges;
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr *w = &scratch[i];
		*w = (struct ibv_recv_wr){
			.wr_id = in[i].wr_id,
			.next = i + 1 < n ? &scratch[i + 1] : NULL,
			.sg_list = in[i].num_sge ? sg : NULL,
			.num_sge = in[i].num_sge,
		};
		sg += in[i].num_sge;
	}
	struct ibv_recv_wr *b = NULL;
	int rc = ibv_post_recv(qp, scratch, &b);
	*bad = rc && b ? (int)(b - scratch) : (rc ? 0 : n);
	return rc;
}

// tsv_get_async reads one async event (0, or errno: EAGAIN when none on a non-blocking fd)
// and resolves its element. Events on objects twosided never creates (SRQ, WQ) are
// acknowledged here, since nobody else could.
int tsv_get_async(struct ibv_context *ctx, struct ibv_async_event *raw, struct tsv_async *out)
{
	if (fn.get_async_event(ctx, raw))
		return errno ? errno : EIO;
	out->type = raw->event_type;
	out->kind = TSV_ELEM_NONE;
	out->port = 0;
	out->handle = 0;
	switch (raw->event_type) {
	case IBV_EVENT_CQ_ERR:
		out->kind = TSV_ELEM_CQ;
		out->handle = (uintptr_t)raw->element.cq->cq_context;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->kind = TSV_ELEM_QP;
		out->handle = (uintptr_t)raw->element.qp->qp_context;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->kind = TSV_ELEM_PORT;
		out->port = raw->element.port_num;
		break;
	case IBV_EVENT_DEVICE_FATAL:
		break;
	default:
		fn.ack_async_event(raw);
		break;
	}
	return 0;
}

void tsv_ack_async_raw(struct ibv_async_event *raw)
{
	fn.ack_async_event(raw);
}

void tsv_ack_async_cq(struct ibv_cq *cq, int type)
{
	struct ibv_async_event ev = { .element.cq = cq, .event_type = type };
	fn.ack_async_event(&ev);
}

void tsv_ack_async_qp(struct ibv_qp *qp, int type)
{
	struct ibv_async_event ev = { .element.qp = qp, .event_type = type };
	fn.ack_async_event(&ev);
}

uint64_t tsv_node_guid(struct ibv_device *dev)
{
	return be64toh(fn.get_device_guid(dev));
}
