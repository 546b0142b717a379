// Render the math arithmatex leaves as \( \) and \[ \] (generic mode), and the $ $ of
// notebook cells, with the KaTeX served from this site.
function renderMathOnPage() {
  renderMathInElement(document.body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "\\[", right: "\\]", display: true },
      { left: "\\(", right: "\\)", display: false },
      { left: "$", right: "$", display: false },
    ],
    ignoredClasses: ["highlight", "highlight-ipynb", "kda-provenance"],
    throwOnError: false,
  });
}
document.addEventListener("DOMContentLoaded", renderMathOnPage);
