//go:build ignore

/* softverbs: configuration, the device, its GID table, faults, strings and small helpers. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <endian.h>
#include "sv.h"

struct sv_config sv_cfg;
struct sv_faults sv_faults;
pthread_mutex_t sv_glock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_faults sv_env_faults;
static struct ibv_device sv_dev;
static uint64_t sv_guid; /* host order */
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;

int64_t sv_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const struct {
	const char *name;
	int val;
} sv_errnos[] = {
	{"EINVAL", EINVAL}, {"EHOSTUNREACH", EHOSTUNREACH}, {"ETIMEDOUT", ETIMEDOUT},
	{"ENETUNREACH", ENETUNREACH}, {"ENODATA", ENODATA}, {"EIO", EIO}, {"EAGAIN", EAGAIN},
	{"ENOMEM", ENOMEM}, {"EPERM", EPERM}, {"ENODEV", ENODEV},
};

static int sv_parse_errno(const char *v)
{
	if (!v || !*v || !strcasecmp(v, "none") || !strcmp(v, "0"))
		return 0;
	for (size_t i = 0; i < sizeof(sv_errnos) / sizeof(sv_errnos[0]); i++)
		if (!strcasecmp(v, sv_errnos[i].name))
			return sv_errnos[i].val;
	if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
		return EINVAL;
	int n = atoi(v);
	return n > 0 ? n : EINVAL;
}

static int sv_truthy(const char *v)
{
	return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
		     !strcasecmp(v, "on"));
}

/* sv_fault_kv applies one key=value to f; unknown keys are ignored. */
static void sv_fault_kv(struct sv_faults *f, const char *k, const char *v)
{
	if (!strcmp(k, "port"))
		f->port_down = !strcasecmp(v, "down");
	else if (!strcmp(k, "fatal"))
		f->fatal = sv_truthy(v);
	else if (!strcmp(k, "rtr_delay_ms"))
		f->rtr_delay_ms = atoi(v) > 0 ? atoi(v) : 0;
	else if (!strcmp(k, "rtr_fail"))
		f->rtr_fail = sv_parse_errno(v);
	else if (!strcmp(k, "drop_pct"))
		f->drop_pct = atoi(v) < 0 ? 0 : atoi(v) > 100 ? 100 : atoi(v);
}

static void sv_init(void)
{
	const char *v;

	snprintf(sv_cfg.name, sizeof(sv_cfg.name), "%s",
		 (v = getenv("SOFTVERBS_DEVICE")) && *v ? v : "softverbs0");
	struct in_addr a;
	if (!(v = getenv("SOFTVERBS_IPV4")) || inet_pton(AF_INET, v, &a) != 1)
		inet_pton(AF_INET, "127.0.0.1", &a);
	memcpy(sv_cfg.ip, &a, 4);
	sv_cfg.ib = (v = getenv("SOFTVERBS_LINK")) && !strcasecmp(v, "ib");
	sv_cfg.roce_v1_only = (v = getenv("SOFTVERBS_ROCE")) && !strcasecmp(v, "v1");
	sv_cfg.lid = (v = getenv("SOFTVERBS_LID")) && atoi(v) > 0 && atoi(v) < 0xc000 ? atoi(v) : 1;
	sv_cfg.active_mtu = IBV_MTU_1024;
	if ((v = getenv("SOFTVERBS_MTU"))) {
		switch (atoi(v)) {
		case 256: sv_cfg.active_mtu = IBV_MTU_256; break;
		case 512: sv_cfg.active_mtu = IBV_MTU_512; break;
		case 1024: sv_cfg.active_mtu = IBV_MTU_1024; break;
		case 2048: sv_cfg.active_mtu = IBV_MTU_2048; break;
		case 4096: sv_cfg.active_mtu = IBV_MTU_4096; break;
		}
	}
	sv_cfg.min_ack_ns = 20 * 1000000LL;
	if ((v = getenv("SOFTVERBS_MIN_ACK_TIMEOUT_MS")) && atoi(v) >= 0)
		sv_cfg.min_ack_ns = atoi(v) * 1000000LL;
	if ((v = getenv("SOFTVERBS_CTL")))
		snprintf(sv_cfg.ctl, sizeof(sv_cfg.ctl), "%s", v);

	if ((v = getenv("SOFTVERBS_PORT")))
		sv_fault_kv(&sv_env_faults, "port", v);
	if ((v = getenv("SOFTVERBS_FATAL")))
		sv_fault_kv(&sv_env_faults, "fatal", v);
	if ((v = getenv("SOFTVERBS_RTR_DELAY_MS")))
		sv_fault_kv(&sv_env_faults, "rtr_delay_ms", v);
	if ((v = getenv("SOFTVERBS_RTR_FAIL")))
		sv_fault_kv(&sv_env_faults, "rtr_fail", v);
	if ((v = getenv("SOFTVERBS_DROP_PCT")))
		sv_fault_kv(&sv_env_faults, "drop_pct", v);
	sv_faults = sv_env_faults;
	sv_ctl_reload();

	/* EUI-64 of the made-up MAC 02:00:a:b:c:d, without the U/L flip: the node GUID. */
	uint8_t g[8] = {0x02, 0x00, sv_cfg.ip[0], 0xff, 0xfe, sv_cfg.ip[1], sv_cfg.ip[2], sv_cfg.ip[3]};
	for (int i = 0; i < 8; i++)
		sv_guid = sv_guid << 8 | g[i];

	sv_dev.node_type = IBV_NODE_CA;
	sv_dev.transport_type = IBV_TRANSPORT_IB;
	snprintf(sv_dev.name, sizeof(sv_dev.name), "%s", sv_cfg.name);
	snprintf(sv_dev.dev_name, sizeof(sv_dev.dev_name), "uverbs_%.48s", sv_cfg.name);
	snprintf(sv_dev.dev_path, sizeof(sv_dev.dev_path), "/sys/class/infiniband_verbs/uverbs_%.48s",
		 sv_cfg.name);
	snprintf(sv_dev.ibdev_path, sizeof(sv_dev.ibdev_path), "/sys/class/infiniband/%.48s",
		 sv_cfg.name);
}

void sv_global_init(void)
{
	pthread_once(&sv_once, sv_init);
}

struct ibv_device *sv_device(void)
{
	sv_global_init();
	return &sv_dev;
}

uint64_t sv_node_guid(void)
{
	sv_global_init();
	return sv_guid;
}

/* sv_ctl_reload re-reads the control file when its contents changed: the faults become the
 * environment's with the file's key=value lines applied on top. */
void sv_ctl_reload(void)
{
	static char last[1024];
	static int have_last;
	char buf[1024];

	if (!sv_cfg.ctl[0])
		return;
	int fd = open(sv_cfg.ctl, O_RDONLY | O_CLOEXEC);
	ssize_t n = 0;
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
	}
	if (n < 0)
		n = 0;
	buf[n] = 0;
	pthread_mutex_lock(&sv_glock);
	if (have_last && !strcmp(last, buf)) {
		pthread_mutex_unlock(&sv_glock);
		return;
	}
	memcpy(last, buf, (size_t)n + 1);
	have_last = 1;
	struct sv_faults f = sv_env_faults;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = 0;
		char *k = line, *v = eq + 1;
		while (isspace((unsigned char)*k))
			k++;
		for (char *e = k + strlen(k); e > k && isspace((unsigned char)e[-1]); e--)
			e[-1] = 0;
		while (isspace((unsigned char)*v))
			v++;
		for (char *e = v + strlen(v); e > v && isspace((unsigned char)e[-1]); e--)
			e[-1] = 0;
		sv_fault_kv(&f, k, v);
	}
	sv_faults = f;
	pthread_mutex_unlock(&sv_glock);
}

void sv_faults_snapshot(struct sv_faults *f)
{
	pthread_mutex_lock(&sv_glock);
	*f = sv_faults;
	pthread_mutex_unlock(&sv_glock);
}

/* The GID table. Ethernet (RoCE, as mlx5 lists an IPv4 netdev): 0 RoCE v1 fe80::, 1 RoCE v2
 * fe80::, 2 RoCE v1 ::ffff:a.b.c.d, 3 RoCE v2 ::ffff:a.b.c.d, the rest empty. InfiniBand: 0
 * fe80::GUID, the rest empty. */
int sv_gid_at(unsigned index, struct sv_gid *out)
{
	sv_global_init();
	memset(out, 0, sizeof(*out));
	if (index >= SV_GID_TBL_LEN)
		return EINVAL;
	uint8_t *g = out->gid.raw;
	uint8_t eui[8] = {0x00, 0x00, sv_cfg.ip[0], 0xff, 0xfe, sv_cfg.ip[1], sv_cfg.ip[2], sv_cfg.ip[3]};
	if (sv_cfg.ib) {
		if (index != 0)
			return ENODATA;
		g[0] = 0xfe;
		g[1] = 0x80;
		eui[0] = 0x02;
		memcpy(g + 8, eui, 8);
		out->type = IBV_GID_TYPE_IB;
		out->valid = 1;
		return 0;
	}
	if (sv_cfg.roce_v1_only && (index & 1))
		return ENODATA;
	switch (index) {
	case 0:
	case 1:
		g[0] = 0xfe;
		g[1] = 0x80;
		memcpy(g + 8, eui, 8);
		break;
	case 2:
	case 3:
		g[10] = g[11] = 0xff;
		memcpy(g + 12, sv_cfg.ip, 4);
		break;
	default:
		return ENODATA;
	}
	out->type = index & 1 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	out->valid = 1;
	return 0;
}

int sv_gid_is_v4mapped(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(g->raw, pfx, 12);
}

int sv_gid_ipv4(const union ibv_gid *g, uint8_t ip[4])
{
	const uint8_t *b = g->raw;
	if (sv_gid_is_v4mapped(g)) {
		memcpy(ip, b + 12, 4);
		return 0;
	}
	/* fe80::/64 with a softverbs interface ID (x x a ff fe b c d). */
	if (b[0] == 0xfe && b[1] == 0x80 && !b[2] && !b[3] && !b[4] && !b[5] && !b[6] && !b[7] &&
	    b[11] == 0xff && b[12] == 0xfe) {
		ip[0] = b[10];
		ip[1] = b[13];
		ip[2] = b[14];
		ip[3] = b[15];
		return 0;
	}
	return -1;
}

/* ---- exported helpers that need no context ---- */

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **l = calloc(2, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	l[0] = sv_device();
	if (num_devices)
		*num_devices = 1;
	return l;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	if (device != sv_device())
		return 0;
	return htobe64(sv_node_guid());
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return device == sv_device() ? 0 : -1;
}

SV_EXPORT const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}

/* ibv_read_sysfs_file answers the few attributes of the softverbs device from its made-up
 * path, and reads real sysfs files otherwise. */
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	if (!dir || !file || !buf || !size) {
		errno = EINVAL;
		return -1;
	}
	struct ibv_device *d = sv_device();
	if (!strcmp(dir, d->ibdev_path) || !strcmp(dir, d->dev_path)) {
		const char *v = NULL;
		if (!strcmp(file, "board_id"))
			v = "SOFTVERBS_0001";
		else if (!strcmp(file, "fw_ver"))
			v = "1.0.0";
		else if (!strcmp(file, "node_type"))
			v = "1: CA";
		else if (!strcmp(file, "ibdev"))
			v = d->name;
		if (!v) {
			errno = ENOENT;
			return -1;
		}
		snprintf(buf, size, "%s", v);
		return (int)strlen(buf);
	}
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	else if ((size_t)n < size)
		buf[n] = 0;
	return (int)n;
}

SV_EXPORT int ibv_fork_init(void)
{
	return 0;
}

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

SV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

SV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = {"InfiniBand channel adapter", "InfiniBand switch",
					"InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP",
					"unspecified"};
	if (t < IBV_NODE_CA || t > IBV_NODE_UNSPECIFIED)
		return "unknown";
	return s[t - IBV_NODE_CA];
}

SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const n[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED",
					"PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
	if ((unsigned)s > IBV_PORT_ACTIVE_DEFER)
		return "unknown";
	return n[s];
}

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const n[] = {
		"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
		"local access violation work queue error", "communication established", "send queue drained",
		"path migrated", "path migration request error", "local catastrophic error", "port active",
		"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
		"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
		"WQ fatal"};
	if ((unsigned)e >= sizeof(n) / sizeof(n[0]))
		return "unknown";
	return n[e];
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const n[] = {
		"success", "local length error", "local QP operation error", "local EE context operation error",
		"local protection error", "Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error", "remote access error",
		"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
		"local RDD violation error", "remote invalid RD request", "aborted error",
		"invalid EE context number", "invalid EE context state", "fatal error", "response timeout error",
		"general error", "TM error", "TM rendezvous incomplete"};
	if ((unsigned)s >= sizeof(n) / sizeof(n[0]))
		return "unknown";
	return n[s];
}

static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} sv_rates[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500}, {IBV_RATE_5_GBPS, 2, 5000}, {IBV_RATE_10_GBPS, 4, 10000},
	{IBV_RATE_20_GBPS, 8, 20000}, {IBV_RATE_30_GBPS, 12, 30000}, {IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000}, {IBV_RATE_80_GBPS, 32, 80000}, {IBV_RATE_120_GBPS, 48, 120000},
	{IBV_RATE_14_GBPS, 0, 14062}, {IBV_RATE_56_GBPS, 0, 56250}, {IBV_RATE_112_GBPS, 0, 112500},
	{IBV_RATE_168_GBPS, 0, 168750}, {IBV_RATE_25_GBPS, 10, 25781}, {IBV_RATE_100_GBPS, 40, 103125},
	{IBV_RATE_200_GBPS, 80, 206250}, {IBV_RATE_300_GBPS, 120, 309375},
	{IBV_RATE_28_GBPS, 11, 28125}, {IBV_RATE_50_GBPS, 20, 53125},
	{IBV_RATE_400_GBPS, 160, 425000}, {IBV_RATE_600_GBPS, 240, 637500},
};
#define SV_NRATES (sizeof(sv_rates) / sizeof(sv_rates[0]))

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mult ? sv_rates[i].mult : -1;
	return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].mult && sv_rates[i].mult == mult)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mbps;
	return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].mbps == mbps)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}
