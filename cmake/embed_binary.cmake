# cmake -DINPUT=file -DOUTPUT=file.c -DNAME=symbol -P embed_binary.cmake
# Writes a C file defining `const unsigned char NAME[]` (64-byte aligned) with
# INPUT's bytes and `const unsigned long NAME_size`.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR n_bytes "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}" "/* Generated from ${INPUT} by cmake/embed_binary.cmake. */\n"
  "const unsigned char ${NAME}[] __attribute__((aligned(64))) = {\n${bytes}\n};\n"
  "const unsigned long ${NAME}_size = ${n_bytes};\n")
