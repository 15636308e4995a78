/*
 * The guest's network: one virtio-net interface with a fixed address.
 *
 * Every sandbox's guest has the same address, gateway and MAC (the template's, restored into every
 * child): each VMM runs in a network namespace of its own on the host, where the tap device is the
 * gateway and the host does NAT and enforces the egress policy (src/net on the host). The guest
 * cannot change what it may reach: its routes and resolv.conf only decide which packets it sends.
 *
 * Set from the kernel command line: collimate.net=<addr>/<prefix>,<gateway>[,<nameserver>].
 */
#include "agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define GUEST_IFNAME "eth0"
#define NET_WAIT_MS 3000

static char net_spec[128];

void net_set_spec(const char *spec)
{
    snprintf(net_spec, sizeof net_spec, "%s", spec);
}

static void set_sockaddr(struct sockaddr *sa, struct in_addr addr)
{
    struct sockaddr_in *sin = (struct sockaddr_in *)sa;
    memset(sin, 0, sizeof *sin);
    sin->sin_family = AF_INET;
    sin->sin_addr = addr;
}

/* The interface shows up once virtio_net has probed the device; modules load just before. */
static bool wait_for_interface(int fd, struct ifreq *ifr)
{
    for (int waited = 0; waited < NET_WAIT_MS; waited += 10) {
        memset(ifr, 0, sizeof *ifr);
        strcpy(ifr->ifr_name, GUEST_IFNAME);
        if (ioctl(fd, SIOCGIFFLAGS, ifr) == 0) return true;
        usleep(10 * 1000);
    }
    return false;
}

static void write_resolv_conf(const char *nameserver)
{
    char text[96];
    int n = snprintf(text, sizeof text, "nameserver %s\n", nameserver);
    /* Images often ship /etc/resolv.conf as a symlink (systemd-resolved); replace it with a file. */
    unlink("/etc/resolv.conf");
    int fd = open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        agent_log("resolv.conf: %s", strerror(errno));
        return;
    }
    if (write(fd, text, (size_t)n) != n) agent_log("resolv.conf: short write");
    close(fd);
}

/* Servers look their own name up (Python's http.server does): answer it locally, not by DNS. */
static void ensure_hosts_entry(void)
{
    char buf[8192];
    int fd = open("/etc/hosts", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
    if (fd >= 0) close(fd);
    buf[n > 0 ? n : 0] = '\0';
    if (strstr(buf, " sandbox") || strstr(buf, "\tsandbox")) return;
    fd = open("/etc/hosts", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    const char *line = strstr(buf, "localhost") ? "127.0.1.1 sandbox\n" : "127.0.0.1 localhost\n127.0.1.1 sandbox\n";
    if (write(fd, line, strlen(line)) < 0) agent_log("hosts: %s", strerror(errno));
    close(fd);
}

void net_configure(void)
{
    ensure_hosts_entry();
    if (!net_spec[0]) return;
    char spec[128], *addr_s = spec, *gw_s, *dns_s, *prefix_s;
    snprintf(spec, sizeof spec, "%s", net_spec);
    gw_s = strchr(spec, ',');
    if (!gw_s) goto bad;
    *gw_s++ = '\0';
    dns_s = strchr(gw_s, ',');
    if (dns_s) *dns_s++ = '\0';
    prefix_s = strchr(addr_s, '/');
    if (!prefix_s) goto bad;
    *prefix_s++ = '\0';
    struct in_addr addr, gw, mask;
    long prefix = strtol(prefix_s, NULL, 10);
    if (inet_pton(AF_INET, addr_s, &addr) != 1 || inet_pton(AF_INET, gw_s, &gw) != 1 || prefix < 1 || prefix > 32) goto bad;
    mask.s_addr = htonl(prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> prefix));

    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        agent_log("net: socket: %s", strerror(errno));
        return;
    }
    struct ifreq ifr;
    if (!wait_for_interface(fd, &ifr)) {
        agent_log("net: no %s after %d ms", GUEST_IFNAME, NET_WAIT_MS);
        close(fd);
        return;
    }
    set_sockaddr(&ifr.ifr_addr, addr);
    if (ioctl(fd, SIOCSIFADDR, &ifr) != 0) agent_log("net: address: %s", strerror(errno));
    set_sockaddr(&ifr.ifr_netmask, mask);
    if (ioctl(fd, SIOCSIFNETMASK, &ifr) != 0) agent_log("net: netmask: %s", strerror(errno));
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) agent_log("net: up: %s", strerror(errno));
    }
    struct rtentry rt;
    memset(&rt, 0, sizeof rt);
    struct in_addr any = { .s_addr = 0 };
    set_sockaddr(&rt.rt_dst, any);
    set_sockaddr(&rt.rt_genmask, any);
    set_sockaddr(&rt.rt_gateway, gw);
    rt.rt_flags = RTF_UP | RTF_GATEWAY;
    rt.rt_dev = (char *)GUEST_IFNAME;
    if (ioctl(fd, SIOCADDRT, &rt) != 0 && errno != EEXIST) agent_log("net: default route: %s", strerror(errno));
    close(fd);
    write_resolv_conf(dns_s && *dns_s ? dns_s : gw_s);
    agent_log("net: %s %s/%ld via %s", GUEST_IFNAME, addr_s, prefix, gw_s);
    return;
bad:
    agent_log("net: cannot parse collimate.net=%s", net_spec);
}
