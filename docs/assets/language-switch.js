// Keep the reader on the same page when switching language. Both editions have the same
// page paths (a test checks it), so the twin of <edition root>/x/ is <other root>/x/.
// Material's own switcher looks the page up in the other edition's sitemap, which fails
// when the Chinese edition sits at the site root, so this handler runs first.
document.addEventListener("click", function (event) {
  var link = event.target.closest && event.target.closest("a.md-select__link[hreflang]");
  if (!link) return;
  var lang = document.documentElement.lang;
  var current = document.querySelector('a.md-select__link[hreflang="' + lang + '"]');
  if (!current || link === current) return;
  var here = window.location.href.split("#")[0];
  if (here.indexOf(current.href) !== 0) return;
  event.preventDefault();
  event.stopImmediatePropagation();
  window.location.href = link.href + here.slice(current.href.length);
}, true);
