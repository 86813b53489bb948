//go:build ignore

/* softverbs: the rest of rdma-core's libibverbs.so.1 symbol set (see README.md, "Symbols").
 *
 * Programs and libraries linked against rdma-core's libibverbs must load against softverbs:
 * librdmacm needs the ibv_copy_*_kern marshalling helpers, pyverbs the import verbs, and the
 * vendor provider libraries (libmlx5, libefa, …, which UCX and libfabric link directly) the
 * IBVERBS_PRIVATE_34 interface between libibverbs and its providers. What softverbs models
 * works; what it does not fails at run time, with the errno rdma-core gives a device without
 * the feature, never at load time:
 *
 * - the IBVERBS_1.0 entry points (the ABI before libibverbs 1.1, with its own structs) see no
 *   device: ibv_get_device_list@IBVERBS_1.0 returns an empty list, the others EOPNOTSUPP;
 * - the IBVERBS_PRIVATE_34 kernel commands (ibv_cmd_*, execute_ioctl) are what a provider
 *   sends to the kernel's uverbs device; softverbs has none (cmd_fd is -1) and never calls a
 *   provider, so they return EOPNOTSUPP; verbs_register_driver_34 (a provider's constructor)
 *   accepts the registration and lists no device for it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <infiniband/sa.h>
#include "sv.h"

/* ---- marshalling between the kernel's uABI structs and libibverbs' (IBVERBS_1.0/1.1) ---- */

SV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

SV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->qp_state = src->qp_state;
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;
	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

SV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = (int)src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = (int)src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = (uint8_t)src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}

SV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = (uint32_t)src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = (uint32_t)src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}

/* ---- IBVERBS_1.1: RoCE L2 resolution ---- */

/* ibv_resolve_eth_l2_from_gid gives the MAC a RoCE packet to the DGID goes to: softverbs'
 * made-up 02:00:a:b:c:d of the DGID's IPv4 address, no VLAN (0xffff). Negative errno as
 * rdma-core: -EINVAL without a GRH or with a bad SGID index, -EHOSTUNREACH for a DGID that
 * resolves to no IPv4 address. */
SV_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
					  uint8_t eth_mac[6], uint16_t *vid)
{
	union ibv_gid sgid;
	uint8_t ip[4];
	if (!context || !attr || !eth_mac || !vid || !attr->is_global)
		return -EINVAL;
	if (ibv_query_gid(context, attr->port_num, attr->grh.sgid_index, &sgid))
		return -EINVAL;
	if (sv_gid_ipv4(&attr->grh.dgid, ip))
		return -EHOSTUNREACH;
	eth_mac[0] = 0x02;
	eth_mac[1] = 0x00;
	memcpy(eth_mac + 2, ip, 4);
	*vid = 0xffff;
	return 0;
}

/* ---- IBVERBS_1.10 / 1.13: sharing objects between processes through the uverbs fd ---- */

/* ibv_import_device takes a device's command fd: a softverbs context's (/dev/null: there is
 * no kernel device) is EOPNOTSUPP, as rdma-core says for a device whose provider cannot
 * import; an fd that is no character device EINVAL, any other ENODEV. */
SV_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct stat st, null;
	if (fstat(cmd_fd, &st) || !S_ISCHR(st.st_mode)) {
		errno = EINVAL;
		return NULL;
	}
	if (!stat("/dev/null", &null) && S_ISCHR(null.st_mode) && st.st_rdev == null.st_rdev) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	errno = ENODEV;
	return NULL;
}

SV_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context, (void)pd_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

SV_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd, (void)mr_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

SV_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context, (void)dm_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

/* ---- IBVERBS_1.0: the ABI before libibverbs 1.1 ---- */

#define SV_V10(name) __asm__(".symver sv10_" #name ", ibv_" #name "@IBVERBS_1.0")

static int sv10_fail(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

static void *sv10_null(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* The only way to a 1.0 object is this list, and it is empty. */
SV_EXPORT void **sv10_get_device_list(int *num)
{
	if (num)
		*num = 0;
	void **l = calloc(1, sizeof(*l));
	if (!l)
		errno = ENOMEM;
	return l;
}
SV_V10(get_device_list);

SV_EXPORT void sv10_free_device_list(void **list)
{
	free(list);
}
SV_V10(free_device_list);

SV_EXPORT const char *sv10_get_device_name(void *d)
{
	(void)d;
	return sv10_null();
}
SV_V10(get_device_name);

SV_EXPORT uint64_t sv10_get_device_guid(void *d)
{
	(void)d;
	sv10_fail();
	return 0;
}
SV_V10(get_device_guid);

SV_EXPORT void sv10_ack_async_event(void *e)
{
	(void)e;
}
SV_V10(ack_async_event);

SV_EXPORT void sv10_ack_cq_events(void *cq, unsigned n)
{
	(void)cq, (void)n;
}
SV_V10(ack_cq_events);

#define SV10_PTR(name)                      \
	SV_EXPORT void *sv10_##name(void)   \
	{                                   \
		return sv10_null();         \
	}                                   \
	SV_V10(name)
#define SV10_INT(name)                      \
	SV_EXPORT int sv10_##name(void)     \
	{                                   \
		return sv10_fail();         \
	}                                   \
	SV_V10(name)
/* -1 and errno, as the 1.0 calls that report through errno */
#define SV10_NEG(name)                      \
	SV_EXPORT int sv10_##name(void)     \
	{                                   \
		sv10_fail();                \
		return -1;                  \
	}                                   \
	SV_V10(name)

SV10_PTR(open_device);
SV10_INT(close_device);
SV10_NEG(get_async_event);
SV10_INT(query_device);
SV10_INT(query_port);
SV10_NEG(query_gid);
SV10_NEG(query_pkey);
SV10_PTR(alloc_pd);
SV10_INT(dealloc_pd);
SV10_PTR(reg_mr);
SV10_INT(dereg_mr);
SV10_PTR(create_cq);
SV10_INT(resize_cq);
SV10_INT(destroy_cq);
SV10_NEG(get_cq_event);
SV10_PTR(create_srq);
SV10_INT(modify_srq);
SV10_INT(query_srq);
SV10_INT(destroy_srq);
SV10_PTR(create_qp);
SV10_INT(query_qp);
SV10_INT(modify_qp);
SV10_INT(destroy_qp);
SV10_PTR(create_ah);
SV10_INT(destroy_ah);
SV10_INT(attach_mcast);
SV10_INT(detach_mcast);

/* ibv_register_driver@IBVERBS_1.1: the registration of a provider of the old plugin
 * interface; accepted, it lists no device. */
SV_EXPORT void sv11_register_driver(const char *name, void *init)
{
	(void)name, (void)init;
}
__asm__(".symver sv11_register_driver, ibv_register_driver@IBVERBS_1.1");

/* ---- IBVERBS_PRIVATE_34: the interface between libibverbs and its providers ---- */

/* rdma-core's flag for RDMAV_ALLOW_DISASSOC_DESTROY; softverbs has no kernel objects to lose. */
SV_EXPORT bool verbs_allow_disassociate_destroy;

/* A provider library's constructor registers its driver; softverbs asks no provider for
 * devices (its own are the only ones), so the registration is kept nowhere. */
SV_EXPORT void verbs_register_driver_34(const void *ops)
{
	(void)ops;
}

static int sv_log_level = -1;

SV_EXPORT void __verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...)
{
	(void)ctx;
	if (sv_log_level < 0) {
		const char *e = getenv("VERBS_LOG_LEVEL");
		sv_log_level = e ? atoi(e) : 0;
	}
	if ((int)level > sv_log_level || !fmt)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

SV_EXPORT void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd, size_t alloc_size,
					      struct verbs_context *context_offset, uint32_t driver_id)
{
	(void)device, (void)cmd_fd, (void)alloc_size, (void)context_offset, (void)driver_id;
	errno = EOPNOTSUPP;
	return NULL;
}

/* verbs_open_device opens a softverbs device as ibv_open_device (private_data is a
 * provider's, which softverbs has none of); any other device is ENODEV. */
SV_EXPORT struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data)
{
	(void)private_data;
	return ibv_open_device(device);
}

SV_EXPORT void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context, struct ibv_comp_channel *channel,
			     void *cq_context)
{
	if (!cq)
		return;
	cq->context = context;
	cq->channel = channel;
	if (channel && context) {
		pthread_mutex_lock(&context->mutex);
		channel->refcnt++;
		pthread_mutex_unlock(&context->mutex);
	}
	cq->cq_context = cq_context;
	cq->comp_events_completed = 0;
	cq->async_events_completed = 0;
	pthread_mutex_init(&cq->mutex, NULL);
	pthread_cond_init(&cq->cond, NULL);
}

SV_EXPORT void verbs_set_ops(struct verbs_context *vctx, const void *ops)
{
	(void)vctx, (void)ops;
}

SV_EXPORT void verbs_uninit_context(struct verbs_context *context)
{
	(void)context;
}

SV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void *link)
{
	(void)link;
	return num_attrs;
}

SV_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...)
{
	(void)buf, (void)size, (void)sysfs_dev, (void)fnfmt;
	errno = ENOENT;
	return -1;
}

static int sv_nocmd(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* Each command a provider sends its kernel device: there is no such device. The arguments
 * (which differ per command) are not looked at. */
#define SV_CMD(name)                    \
	SV_EXPORT int name(void)        \
	{                               \
		return sv_nocmd();      \
	}

SV_CMD(execute_ioctl)
SV_CMD(ibv_cmd_advise_mr)
SV_CMD(ibv_cmd_alloc_dm)
SV_CMD(ibv_cmd_alloc_mw)
SV_CMD(ibv_cmd_alloc_pd)
SV_CMD(ibv_cmd_attach_mcast)
SV_CMD(ibv_cmd_close_xrcd)
SV_CMD(ibv_cmd_create_ah)
SV_CMD(ibv_cmd_create_counters)
SV_CMD(ibv_cmd_create_cq)
SV_CMD(ibv_cmd_create_cq_ex)
SV_CMD(ibv_cmd_create_flow)
SV_CMD(ibv_cmd_create_flow_action_esp)
SV_CMD(ibv_cmd_create_qp)
SV_CMD(ibv_cmd_create_qp_ex)
SV_CMD(ibv_cmd_create_qp_ex2)
SV_CMD(ibv_cmd_create_rwq_ind_table)
SV_CMD(ibv_cmd_create_srq)
SV_CMD(ibv_cmd_create_srq_ex)
SV_CMD(ibv_cmd_create_wq)
SV_CMD(ibv_cmd_dealloc_mw)
SV_CMD(ibv_cmd_dealloc_pd)
SV_CMD(ibv_cmd_dereg_mr)
SV_CMD(ibv_cmd_destroy_ah)
SV_CMD(ibv_cmd_destroy_counters)
SV_CMD(ibv_cmd_destroy_cq)
SV_CMD(ibv_cmd_destroy_flow)
SV_CMD(ibv_cmd_destroy_flow_action)
SV_CMD(ibv_cmd_destroy_qp)
SV_CMD(ibv_cmd_destroy_rwq_ind_table)
SV_CMD(ibv_cmd_destroy_srq)
SV_CMD(ibv_cmd_destroy_wq)
SV_CMD(ibv_cmd_detach_mcast)
SV_CMD(ibv_cmd_free_dm)
SV_CMD(ibv_cmd_get_context)
SV_CMD(ibv_cmd_modify_cq)
SV_CMD(ibv_cmd_modify_flow_action_esp)
SV_CMD(ibv_cmd_modify_qp)
SV_CMD(ibv_cmd_modify_qp_ex)
SV_CMD(ibv_cmd_modify_srq)
SV_CMD(ibv_cmd_modify_wq)
SV_CMD(ibv_cmd_open_qp)
SV_CMD(ibv_cmd_open_xrcd)
SV_CMD(ibv_cmd_post_recv)
SV_CMD(ibv_cmd_post_send)
SV_CMD(ibv_cmd_post_srq_recv)
SV_CMD(ibv_cmd_query_context)
SV_CMD(ibv_cmd_query_device_any)
SV_CMD(ibv_cmd_query_mr)
SV_CMD(ibv_cmd_query_port)
SV_CMD(ibv_cmd_query_qp)
SV_CMD(ibv_cmd_query_srq)
SV_CMD(ibv_cmd_read_counters)
SV_CMD(ibv_cmd_reg_dm_mr)
SV_CMD(ibv_cmd_reg_dmabuf_mr)
SV_CMD(ibv_cmd_reg_mr)
SV_CMD(ibv_cmd_req_notify_cq)
SV_CMD(ibv_cmd_rereg_mr)
SV_CMD(ibv_cmd_resize_cq)

/* ibv_cmd_poll_cq answers as a poll: -1 and errno. */
SV_EXPORT int ibv_cmd_poll_cq(void)
{
	sv_nocmd();
	return -1;
}
