# cmake -DINPUT=file -DOUTPUT=file.cc -DSYMBOL=Name -DLABEL=text -P embed_text.cmake
# Writes a C++ file defining std::string_view SYMBOL() over INPUT's bytes and
# SYMBOL##Name() returning LABEL: data compiled into the binary, so no install
# path has to be found at run time.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR bytes "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUTPUT}"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n"
  "#include <string_view>\n"
  "namespace pdq {\n"
  "namespace {\n"
  "constexpr unsigned char kData[] = {${body} 0};\n"
  "}  // namespace\n"
  "std::string_view ${SYMBOL}() {\n"
  "  return std::string_view(reinterpret_cast<const char*>(kData), ${bytes});\n"
  "}\n"
  "std::string_view ${SYMBOL}Name() { return \"${LABEL}\"; }\n"
  "}  // namespace pdq\n")
