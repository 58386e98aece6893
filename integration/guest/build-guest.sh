#!/usr/bin/env bash
# integration/guest/build-guest.sh OUTDIR [KERNEL_VERSION]
#
# Builds a tiny bootable guest from what Debian packages install on the host:
#   OUTDIR/vmlinuz     the linux-image-amd64 kernel (/boot/vmlinuz-VERSION, copied world-readable)
#   OUTDIR/initrd.img  a gzip'd newc cpio: busybox-static, the virtio-net/virtio-pci modules of
#                      that kernel (with their modules.dep dependencies, decompressed) and /init
#   OUTDIR/cmdline     the kernel command line to boot it with
#
# /init mounts proc/sys/dev, loads the modules, brings every NIC up and prints to the console:
#   VIREO-NIC name=eth0 mac=fa:16:3e:00:00:01 operstate=up carrier=1 driver=virtio_net
#   VIREO-GUEST-READY nics=2 uptime=1.23
# then idles; with `vireo.poweroff` on the kernel command line it powers off instead, and with
# `vireo.nics=N` it waits (up to 20 s) until N NICs exist before printing.
# Needs: linux-image-amd64, busybox-static, cpio (integration/host-setup.sh up installs them).
set -euo pipefail

OUT=${1:?usage: build-guest.sh OUTDIR [KERNEL_VERSION]}
KVER=${2:-}
if [[ -z $KVER ]]; then
  KVER=$(find /boot -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' | sed 's/^vmlinuz-//' | sort -V | tail -1)
fi
[[ -n $KVER && -f /boot/vmlinuz-$KVER ]] || {
  echo "no kernel in /boot (install linux-image-amd64)" >&2
  exit 1
}
MODDIR=/lib/modules/$KVER
[[ -f $MODDIR/modules.dep ]] || {
  echo "no $MODDIR/modules.dep" >&2
  exit 1
}
BUSYBOX=$(command -v busybox || true)
[[ -x /bin/busybox ]] && BUSYBOX=/bin/busybox
[[ -n $BUSYBOX ]] && file_is_static=$(ldd "$BUSYBOX" 2>&1 || true)
[[ ${file_is_static:-} == *"not a dynamic executable"* ]] || {
  echo "need a static busybox (install busybox-static)" >&2
  exit 1
}
command -v cpio >/dev/null || {
  echo "need cpio" >&2
  exit 1
}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

# Modules in load order: each module's dependencies (from modules.dep) before it.
ORDER=()
declare -A SEEN=()
add_module() { # add_module PATH_RELATIVE_TO_MODDIR
  local rel=$1 deps dep
  [[ -n ${SEEN[$rel]:-} ]] && return
  SEEN[$rel]=1
  deps=$(awk -v m="$rel:" '$1 == m { $1 = ""; print; exit }' "$MODDIR/modules.dep")
  for dep in $deps; do add_module "$dep"; done
  ORDER+=("$rel")
}
module_path() { # module name -> path in modules.dep
  awk -v n="$1" -F: '{ f = $1; sub(/.*\//, "", f); sub(/\.ko(\.(xz|zst|gz))?$/, "", f); gsub(/-/, "_", f) }
    f == n { print $1; exit }' "$MODDIR/modules.dep"
}
# virtio NICs and disks; AHCI, SCSI CD-ROM and ISO 9660 for the config drive (a SATA CD-ROM).
for m in virtio_pci virtio_net virtio_blk ahci sr_mod isofs; do
  p=$(module_path "$m")
  if [[ -z $p ]]; then
    if grep -qE "/$m\.ko" "$MODDIR/modules.builtin" 2>/dev/null; then continue; fi
    echo "module $m not found for $KVER" >&2
    exit 1
  fi
  add_module "$p"
done

mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,run,tmp,etc,lib/modules}
cp "$BUSYBOX" "$STAGE/bin/busybox"
: >"$STAGE/etc/modules.order"
for rel in "${ORDER[@]}"; do
  base=$(basename "$rel")
  case $base in
  *.ko.xz) xz -dc "$MODDIR/$rel" >"$STAGE/lib/modules/${base%.xz}" ;;
  *.ko.zst) zstd -qdc "$MODDIR/$rel" >"$STAGE/lib/modules/${base%.zst}" ;;
  *.ko.gz) gzip -dc "$MODDIR/$rel" >"$STAGE/lib/modules/${base%.gz}" ;;
  *) cp "$MODDIR/$rel" "$STAGE/lib/modules/$base" ;;
  esac
  echo "${base%.ko*}.ko" >>"$STAGE/etc/modules.order"
done
# The kernel opens /dev/console before /init runs; devtmpfs is mounted only by /init.
mknod -m 600 "$STAGE/dev/console" c 5 1 2>/dev/null || true
mknod -m 666 "$STAGE/dev/null" c 1 3 2>/dev/null || true

cat >"$STAGE/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
echo "VIREO-GUEST-BOOT kernel=$(uname -r)"
for m in $(cat /etc/modules.order); do
  insmod "/lib/modules/$m" || echo "VIREO-GUEST-WARN insmod $m failed"
done
want=0
for arg in $(cat /proc/cmdline); do
  case $arg in
  vireo.nics=*) want=${arg#vireo.nics=} ;;
  esac
done
nics() { for d in /sys/class/net/*; do [ "${d##*/}" = lo ] || echo "${d##*/}"; done; }
i=0
while [ "$want" -gt 0 ] && [ "$(nics | wc -l)" -lt "$want" ] && [ $i -lt 200 ]; do
  sleep 0.1
  i=$((i + 1))
done
for n in $(nics); do ip link set "$n" up 2>/dev/null; done
# operstate follows "link up" asynchronously: give it up to 3 s
i=0
while [ $i -lt 30 ]; do
  settled=1
  for n in $(nics); do
    [ "$(cat /sys/class/net/$n/operstate)" = down ] && [ "$(cat /sys/class/net/$n/carrier 2>/dev/null)" = 1 ] && settled=0
  done
  [ $settled = 1 ] && break
  sleep 0.1
  i=$((i + 1))
done
count=0
for n in $(nics); do
  d=/sys/class/net/$n
  drv=$(basename "$(readlink "$d/device/driver" 2>/dev/null)" 2>/dev/null)
  echo "VIREO-NIC name=$n mac=$(cat $d/address) operstate=$(cat $d/operstate) carrier=$(cat $d/carrier 2>/dev/null || echo -) driver=${drv:--}"
  count=$((count + 1))
done
wantdisks=0
wantcd=0
for arg in $(cat /proc/cmdline); do
  case $arg in
  vireo.disks=*) wantdisks=${arg#vireo.disks=} ;;
  vireo.cd=*) wantcd=${arg#vireo.cd=} ;;
  esac
done
i=0
while [ "$(ls /sys/block | grep -c '^vd')" -lt "$wantdisks" ] && [ $i -lt 100 ]; do
  sleep 0.1
  i=$((i + 1))
done
for d in /sys/block/vd*; do
  [ -e "$d" ] || continue
  n=${d##*/}
  head=$(dd if=/dev/$n bs=8 count=1 2>/dev/null | hexdump -v -e '8/1 "%02x"')
  echo "VIREO-DISK name=$n bytes=$(($(cat $d/size) * 512)) head=$head"
done
if [ "$wantdisks" -gt 0 ] && grep -qw vireo.write /proc/cmdline; then
  # 512 bytes of 'X' at 1 MiB of vda, synced: the host finds them in this guest's disk.
  if dd if=/dev/zero bs=512 count=1 2>/dev/null | tr '\000' 'X' |
    dd of=/dev/vda bs=512 seek=2048 conv=fsync 2>/dev/null; then
    echo "VIREO-DISK-WROTE name=vda offset=1048576"
  fi
fi
if [ "$wantcd" = 1 ]; then
  i=0
  while [ ! -b /dev/sr0 ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  mkdir -p /mnt/cd
  if mount -t iso9660 -o ro /dev/sr0 /mnt/cd 2>/dev/null; then
    uuid=$(grep -o '"uuid": *"[^"]*"' /mnt/cd/openstack/latest/meta_data.json | sed 's/.*"\([^"]*\)"$/\1/')
    ud=$(head -c 64 /mnt/cd/openstack/latest/user_data 2>/dev/null | tr -c 'a-zA-Z0-9.-' '_')
    echo "VIREO-CONFIG-DRIVE uuid=$uuid user_data=$ud"
    umount /mnt/cd
  else
    echo "VIREO-CONFIG-DRIVE mount=failed"
  fi
fi
echo "VIREO-GUEST-READY nics=$count uptime=$(cut -d' ' -f1 /proc/uptime)"
if grep -qw vireo.poweroff /proc/cmdline; then
  poweroff -f
fi
while true; do sleep 3600; done
EOF
chmod 755 "$STAGE/init"

(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) |
  gzip -9 >"$OUT/initrd.img.tmp"
mv "$OUT/initrd.img.tmp" "$OUT/initrd.img"
install -m 644 "/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
echo "console=ttyS0 panic=-1 quiet loglevel=4" >"$OUT/cmdline"
chmod 755 "$OUT"
chmod 644 "$OUT/initrd.img" "$OUT/cmdline"
echo "guest: kernel $KVER, modules: ${ORDER[*]##*/}" >&2
echo "$OUT/vmlinuz $OUT/initrd.img"
