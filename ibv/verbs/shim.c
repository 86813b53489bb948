//go:build rdma

#include <errno.h>
#include <fcntl.h>
#include <endian.h>
#include <arpa/inet.h>
#include "shim.h"

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
	return ibv_reg_mr(pd, addr, len, access);
}

int tsv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out)
{
	return ibv_query_port(ctx, port, out);
}

ssize_t tsv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max)
{
	return ibv_query_gid_table(ctx, entries, max, 0);
}

struct ibv_cq *tsv_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle,
			     struct ibv_comp_channel *ch, int comp_vector)
{
	return ibv_create_cq(ctx, cqe, (void *)handle, ch, comp_vector);
}

int tsv_num_comp_vectors(struct ibv_context *ctx)
{
	return ctx->num_comp_vectors;
}

// tsv_get_cq_event returns 0, or errno (EAGAIN on an empty non-blocking channel).
int tsv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, uintptr_t *handle)
{
	void *ctx = NULL;
	if (ibv_get_cq_event(ch, cq, &ctx))
		return errno ? errno : EIO;
	*handle = (uintptr_t)ctx;
	return 0;
}

int tsv_req_notify(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

int tsv_poll(struct ibv_cq *cq, int n, struct ibv_wc *raw, struct tsv_wc *out)
{
	int got = ibv_poll_cq(cq, n, raw);
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
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	if (qp)
		*cap = attr.cap;
	return qp;
}

// tsv_post_send chains n flat WRs in scratch and posts them. On failure *bad is the index
// of the first WR not posted and the return value is the errno.
int tsv_post_send(struct ibv_qp *qp, const struct tsv_send *in, int n,
		  struct ibv_sge *sges, struct ibv_send_wr *scratch, int *bad)
{
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

int tsv_post_recv(struct ibv_qp *qp, const struct tsv_recv *in, int n,
		  struct ibv_sge *sges, struct ibv_recv_wr *scratch, int *bad)
{
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
	if (ibv_get_async_event(ctx, raw))
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
		ibv_ack_async_event(raw);
		break;
	}
	return 0;
}

void tsv_ack_async_raw(struct ibv_async_event *raw)
{
	ibv_ack_async_event(raw);
}

void tsv_ack_async_cq(struct ibv_cq *cq, int type)
{
	struct ibv_async_event ev = { .element.cq = cq, .event_type = type };
	ibv_ack_async_event(&ev);
}

void tsv_ack_async_qp(struct ibv_qp *qp, int type)
{
	struct ibv_async_event ev = { .element.qp = qp, .event_type = type };
	ibv_ack_async_event(&ev);
}

uint64_t tsv_node_guid(struct ibv_device *dev)
{
	return be64toh(ibv_get_device_guid(dev));
}
