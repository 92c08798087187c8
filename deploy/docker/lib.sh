# What the image scripts share (sourced, not run): a root filesystem holding one binary,
# the shared libraries it links and a non-root user 65532, and the build of an image
# `FROM scratch` around it.

# rootfs_with_binary FS BINARY DEST NAME: copies BINARY, stripped, to FS/DEST; the
# libraries and dynamic loader `ldd` lists, at the paths the binary asks for (glibc's
# "files" and "dns" name services are built into libc, so host names resolve); an
# /etc/nsswitch.conf; and a user and group NAME (65532).
rootfs_with_binary() {
  local fs=$1 binary=$2 dest=$3 name=$4
  mkdir -p "$fs$(dirname "$dest")" "$fs/etc" "$fs/tmp"
  chmod 1777 "$fs/tmp"
  strip --strip-all -o "$fs$dest" "$binary"
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
    while read -r lib; do
      mkdir -p "$fs$(dirname "$lib")"
      cp -L "$lib" "$fs$lib"
    done
  printf 'root:x:0:0:root:/nonexistent:/nonexistent\n%s:x:65532:65532:%s:/nonexistent:/nonexistent\n' \
    "$name" "$name" > "$fs/etc/passwd"
  printf 'root:x:0:\n%s:x:65532:\n' "$name" > "$fs/etc/group"
  echo 'hosts: files dns' > "$fs/etc/nsswitch.conf"
}

# build_image CTX TAG VERSION: builds CTX/Dockerfile as TAG, labelled with VERSION; prints
# {"image": TAG, "bytes": SIZE}.
build_image() {
  local ctx=$1 tag=$2 version=$3
  docker build --quiet --label "org.opencontainers.image.version=$version" -t "$tag" "$ctx" >/dev/null
  local size
  size=$(docker image inspect --format '{{.Size}}' "$tag")
  echo "{\"image\":\"$tag\",\"bytes\":$size}"
}
